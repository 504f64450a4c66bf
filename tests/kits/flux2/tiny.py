"""Tiny FLUX.2 [klein] components and a tiny Flux2KleinPipeline folder, built under a seed.

The modules keep the released layout and its proportions (double then single blocks, the
32-channel-style VAE with its BatchNorm statistics, a Qwen3 causal LM deep enough for the
pipeline's layers 9, 18 and 27, whose three states make the transformer's text width) at a
fraction of the size; ``Flux2KleinPipeline.from_pretrained(folder)`` reads it offline. The
tokenizer is the committed tiny Qwen3 one (tests/assets/qwen3_tokenizer).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import torch

from library.models.families.flux.tiny import build_seeded
from library.models.families.flux2.spec import SCHEDULER_CONFIG, TEXT_LAYERS
from tools.make_test_assets import ASSETS_DIR

TOKENIZER = ASSETS_DIR / "qwen3_tokenizer"
TEXT_WIDTH = 8
LATENT_CHANNELS = 4  # the released VAE's 32, patched to 4 x 32 = 128 transformer channels


@functools.cache
def vocab_size() -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(TOKENIZER)))


def transformer_config() -> dict:
    """Flux2Transformer2DModel kwargs: 2 double + 3 single blocks, 2 heads of 16, klein's
    missing guidance input; the text width is three Qwen3 states."""
    return dict(patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=2, num_single_layers=3,
                attention_head_dim=16, num_attention_heads=2,
                joint_attention_dim=len(TEXT_LAYERS["klein"]) * TEXT_WIDTH,
                timestep_guidance_channels=32, mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4),
                rope_theta=2000, guidance_embeds=False)  # fmt: skip


def vae_config() -> dict:
    return dict(block_out_channels=(8, 16, 16, 16), layers_per_block=1, latent_channels=LATENT_CHANNELS,
                norm_num_groups=4, sample_size=64)  # fmt: skip


def text_encoder_config() -> dict:
    return dict(vocab_size=vocab_size(), hidden_size=TEXT_WIDTH, intermediate_size=16,
                num_hidden_layers=28, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                max_position_embeddings=1024, tie_word_embeddings=True)  # fmt: skip


def _with_statistics(vae):
    """The VAE's BatchNorm running statistics away from (0, 1), so the normalisation shows."""
    with torch.no_grad():
        vae.bn.running_mean.copy_(0.3 * torch.randn(vae.bn.num_features))
        vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.num_features))
    return vae


def build_tiny_flux2_components(seed: int = 0) -> dict:
    """transformer, vae and text_encoder (Qwen3ForCausalLM) drawn under ``seed``."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    builders = {
        "transformer": lambda: Flux2Transformer2DModel(**transformer_config()),
        "vae": lambda: _with_statistics(AutoencoderKLFlux2(**vae_config())),
        "text_encoder": lambda: Qwen3ForCausalLM(Qwen3Config(**text_encoder_config())),
    }
    return build_seeded(builders, seed)


def model_index(distilled: bool) -> dict:
    import diffusers

    index = {
        "_class_name": "Flux2KleinPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2TokenizerFast"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }
    return {**index, "is_distilled": True} if distilled else index


def write_tiny_flux2_folder(path: str | Path, variant: str = "klein-base", seed: int = 0) -> Path:
    """A tiny FLUX.2 [klein] ``variant`` ("klein-base" or "klein": distilled) as a diffusers
    Flux2KleinPipeline folder (float32); returns ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_flux2_components(seed).items():
        module.save_pretrained(path / name)
    shutil.copytree(TOKENIZER, path / "tokenizer", dirs_exist_ok=True)
    FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG).save_pretrained(path / "scheduler")
    index = model_index(distilled=variant == "klein")
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path
