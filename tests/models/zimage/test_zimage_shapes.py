"""The Z-Image configs: full-size parameter counts (built on the meta device) against published
figures and a hand count, and the tiny configs keeping the released layout."""

from __future__ import annotations

import re

import pytest
import torch

from library.models.families.zimage import shapes
from tests.kits.zimage import tiny_shapes


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def transformer_by_hand(c: dict) -> int:
    """Parameters of the single-stream DiT from its config, counted layer by layer."""
    d, head = c["dim"], c["dim"] // c["n_heads"]
    adaln = min(d, 256)  # the timestep embedding width
    ffn = int(d / 3 * 8)
    plain_block = 4 * d * d + 2 * head + 3 * d * ffn + 4 * d  # attention, qk norms, FFN, 4 norms
    modulated_block = plain_block + adaln * 4 * d + 4 * d  # + adaLN (4 modulations) with bias
    patch = c["all_patch_size"][0] ** 2 * c["all_f_patch_size"][0] * c["in_channels"]
    t_embedder = (256 * 1024 + 1024) + (1024 * adaln + adaln)  # 256 freqs, 1024 hidden
    cap_embedder = c["cap_feat_dim"] + (c["cap_feat_dim"] * d + d)  # RMSNorm, Linear
    x_embedder = patch * d + d
    final_layer = (d * patch + patch) + (adaln * d + d)  # linear, adaLN scale
    pad_tokens = 2 * d  # x_pad_token, cap_pad_token
    joint_and_noise_refiner = (c["n_layers"] + c["n_refiner_layers"]) * modulated_block
    context_refiner = c["n_refiner_layers"] * plain_block
    return (
        joint_and_noise_refiner
        + context_refiner
        + t_embedder
        + cap_embedder
        + x_embedder
        + final_layer
        + pad_tokens
    )


@pytest.fixture(scope="module")
def full_size():
    from diffusers import ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    with torch.device("meta"):
        return {
            "transformer": ZImageTransformer2DModel(**shapes.transformer_config()),
            "text_encoder": Qwen3Model(Qwen3Config(**shapes.text_encoder_config())),
        }


def test_full_size_transformer_is_the_6b_dit(full_size):
    n = count(full_size["transformer"])
    assert n == transformer_by_hand(shapes.transformer_config())
    assert round(n / 1e9, 2) == 6.15  # "6B" in Tongyi-MAI's model cards


def test_full_size_text_encoder_is_qwen3_4b(full_size):
    model = full_size["text_encoder"]
    n = count(model)
    # Qwen3-4B's model card: 4.0B parameters, 3.6B without the (tied) embedding
    assert round(n / 1e9, 1) == 4.0
    assert round((n - model.embed_tokens.weight.numel()) / 1e9, 1) == 3.6
    assert model.config.hidden_size == shapes.transformer_config()["cap_feat_dim"]


def test_head_dims_split_into_rope_axes():
    for config in (shapes.transformer_config(), tiny_shapes.tiny_transformer_config()):
        assert config["dim"] // config["n_heads"] == sum(config["axes_dims"])
        assert all(a % 2 == 0 for a in config["axes_dims"])


def test_tiny_transformer_has_the_released_layout(full_size):
    from diffusers import ZImageTransformer2DModel

    def names(model):
        # block indices folded: the tiny model has fewer joint blocks
        return {re.sub(r"^(layers)\.\d+\.", r"\1.N.", k) for k in model.state_dict()}

    tiny = ZImageTransformer2DModel(**tiny_shapes.tiny_transformer_config())
    assert names(tiny) == names(full_size["transformer"])
    assert tiny.config.cap_feat_dim == tiny_shapes.tiny_text_encoder_config()["hidden_size"]


def test_scheduler_configs_are_static_shifts():
    from diffusers import FlowMatchEulerDiscreteScheduler

    for variant, shift in (("turbo", 3.0), ("base", 6.0)):
        scheduler = FlowMatchEulerDiscreteScheduler(**shapes.scheduler_config(variant))
        assert scheduler.config.shift == shift and not scheduler.config.use_dynamic_shifting
    with pytest.raises(ValueError, match="unknown Z-Image variant"):
        shapes.scheduler_config("dev")


def test_ae_is_flux_ae():
    config = shapes.ae_config()
    assert (config["latent_channels"], config["scaling_factor"], config["shift_factor"]) == (
        16,
        0.3611,
        0.1159,
    )
    assert len(tiny_shapes.tiny_ae_config()["block_out_channels"]) == 4  # 8x down, as released
