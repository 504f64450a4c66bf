"""Flux.1 LoRA setup: kohya's default targets, the saved file diffusers loads, and the choices
that are refused before training."""

from __future__ import annotations

import copy

import pytest
import torch
from flux_fixtures import plain_flux_pipeline, tiny_flux_components

from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.flux.lora_keys import target_paths, transformer_modules
from library.networks.lora import lora_layers, randomize_lora, set_lora_scale
from library.saving.lora_file import read_lora_file, save_lora_file
from library.training.setup import setup_training


def _config(**network):
    return Config(
        model={"pretrained_model_name_or_path": "unused"},
        network={"network_train_unet_only": True, "network_dim": 4, "network_alpha": 2.0,
                 **network},  # fmt: skip
        optimizer={"learning_rate": 1e-4},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )


def test_lora_targets_are_kohyas_and_diffusers_loads_the_file(tmp_path):
    from diffusers import FluxPipeline

    c = tiny_flux_components()
    base = copy.deepcopy(c.denoiser)
    parts = setup_training(_config(), c)
    transformer = parts.components.denoiser
    # every Linear kohya's networks.lora_flux adapts, and nothing else; only adapters train
    assert sorted(lora_layers(transformer)) == sorted(target_paths(transformer_modules(base)))
    assert [n for n, _ in parts.trained_modules()] == ["unet"]
    randomize_lora(transformer, torch.Generator().manual_seed(0), std=0.3)
    # diffusers splits single-block linear1 by Flux.1's full widths (3072, ..., 12288), so a
    # tiny model's linear1 cannot go through it (tests/networks/test_flux_lora_keys.py checks
    # linear1 at full width): switch those adapters off here and leave them out of its file.
    linear1 = [p for p in lora_layers(transformer) if p.startswith("single_transformer_blocks.")
               and p.rsplit(".", 1)[-1] in ("to_q", "to_k", "to_v", "proj_mlp")]  # fmt: skip
    set_lora_scale(transformer, dict.fromkeys(linear1, 0.0))
    path = tmp_path / "flux-lora.safetensors"
    save_lora_file(path, c.family.lora_tensors(parts.lora_models()), {}, torch.float32)
    tensors, _ = read_lora_file(str(path))
    assert all(k.startswith("lora_unet_") for k in tensors)
    assert any(k.startswith("lora_unet_double_blocks_0_img_attn_qkv.") for k in tensors)
    assert any(k.startswith("lora_unet_single_blocks_1_linear1.") for k in tensors)
    # diffusers' own Flux LoRA loader consumes the file into a fresh copy of the base model
    kept = tmp_path / "without-linear1.safetensors"
    save_lora_file(kept, {k: v for k, v in tensors.items() if "_linear1." not in k}, {}, torch.float32)
    state = FluxPipeline.lora_state_dict(str(kept))
    theirs = copy.deepcopy(base)
    theirs.load_lora_adapter(state, prefix="transformer", adapter_name="ours")
    gen = torch.Generator().manual_seed(1)
    inputs = {
        "hidden_states": torch.randn(1, 16, 64, generator=gen),
        "encoder_hidden_states": torch.randn(1, 7, 48, generator=gen),
        "pooled_projections": torch.randn(1, 24, generator=gen),
        "timestep": torch.tensor([0.4]),
        "img_ids": torch.zeros(16, 3),
        "txt_ids": torch.zeros(7, 3),
        "guidance": torch.tensor([3.5]),
    }
    with torch.no_grad():
        ours, loaded, plain = (m(**inputs).sample for m in (transformer, theirs, base))
    torch.testing.assert_close(loaded, ours, rtol=1e-4, atol=1e-5)
    assert (ours - plain).abs().max() > 1e-3  # the adapter changes the output


@pytest.mark.parametrize("t5", [False, True], ids=["clip-l", "clip-l+t5"])
def test_text_encoder_adapters_are_kohyas_and_load_back(tmp_path, t5):
    """With the text encoders training, CLIP-L gets kohya's adapters (lora_te1_) and, with
    train_t5xxl, T5 too (lora_te3_); diffusers loads the CLIP-L part into its text encoder."""
    from safetensors.torch import save_file

    args = ["train_t5xxl=True"] if t5 else []
    config = _config(network_train_unet_only=False, network_args=args)
    flow = {"train_t5xxl": True} if t5 else {}  # what config.flow gives the loader
    c = tiny_flux_components(**flow)
    clip_base = copy.deepcopy(c.text_encoders[0])
    parts = setup_training(config, c)
    assert [n for n, _ in parts.trained_modules()] == (
        ["unet", "text_encoder", "text_encoder_2"] if t5 else ["unet", "text_encoder"]
    )
    clip, t5_model = c.text_encoders
    assert len(lora_layers(clip)) == 6 * clip.config.num_hidden_layers  # q k v out fc1 fc2
    if t5:  # T5's config has dropout 0.1: off, or training mode would draw from the global RNG
        assert all(m.p == 0 for m in t5_model.modules() if isinstance(m, torch.nn.Dropout))
    t5_layers = lora_layers(t5_model)
    # T5's self-attention q, k, v, o and gated feed-forward wi_0, wi_1, wo per block
    assert len(t5_layers) == (7 * t5_model.config.num_layers if t5 else 0)
    for model in (clip, t5_model):
        randomize_lora(model, torch.Generator().manual_seed(2), std=0.3)
    path = tmp_path / "flux-te.safetensors"
    saved = c.family.lora_tensors(parts.lora_models())
    save_lora_file(path, saved, {}, torch.float32)
    assert any(k.startswith("lora_te1_text_model_encoder_layers_0_self_attn_q_proj.") for k in saved)
    assert any(k.startswith("lora_te3_encoder_block_0_layer_0_SelfAttention_q.") for k in saved) == t5
    again = setup_training(_config(network_train_unet_only=False, network_args=args,
                                   network_weights=str(path)), tiny_flux_components(**flow))  # fmt: skip
    reloaded = again.components.family.lora_tensors(again.lora_models())
    assert reloaded.keys() == saved.keys()
    for key, value in saved.items():
        torch.testing.assert_close(reloaded[key], value, rtol=0, atol=1e-7)
    # diffusers' Flux loader puts lora_te1_ into CLIP-L: the same pooled output as ours
    clip_only = tmp_path / "clip.safetensors"
    save_file({k: v for k, v in saved.items() if k.startswith("lora_te1_")}, str(clip_only))
    fresh = tiny_flux_components()
    fresh.text_encoders = (clip_base, fresh.text_encoders[1])
    pipe = plain_flux_pipeline(fresh)
    pipe.load_lora_weights(str(clip_only))
    ids = c.tokenizers[0](["a red circle"], padding="max_length", max_length=77,
                          return_tensors="pt").input_ids  # fmt: skip
    with torch.no_grad():
        theirs, ours = pipe.text_encoder(ids).pooler_output, clip(ids).pooler_output
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(ours, tiny_flux_components().text_encoders[0](ids).pooler_output)


def test_our_file_loads_back_as_network_weights(tmp_path):
    c = tiny_flux_components()
    parts = setup_training(_config(), c)
    randomize_lora(parts.components.denoiser, torch.Generator().manual_seed(0), std=0.3)
    path = tmp_path / "flux-lora.safetensors"
    saved = c.family.lora_tensors(parts.lora_models())
    save_lora_file(path, saved, {}, torch.float32)
    again = setup_training(_config(network_weights=str(path)), tiny_flux_components())
    reloaded = again.components.family.lora_tensors(again.lora_models())
    assert saved.keys() == reloaded.keys()
    for key, value in saved.items():
        torch.testing.assert_close(reloaded[key], value, rtol=0, atol=1e-7)


@pytest.mark.parametrize("blocks", ["single", "double"])
def test_train_blocks_adapts_only_those_blocks(tmp_path, blocks):
    """kohya's train_blocks network argument: adapters and saved names of those blocks only."""
    c = tiny_flux_components(train_blocks=blocks)
    parts = setup_training(_config(network_args=[f"train_blocks={blocks}"]), c)
    paths = lora_layers(parts.components.denoiser)
    inside = "single_transformer_blocks." if blocks == "single" else "transformer_blocks."
    assert paths and all(p.startswith(inside) for p in paths)
    names = {k.split(".")[0] for k in c.family.lora_tensors(parts.lora_models())}
    assert names and all(n.startswith(f"lora_unet_{blocks}_blocks_") for n in names)


@pytest.mark.parametrize(
    "network,needle",
    [
        ({"conv_dim": 4}, "conv_dim"),
    ],
)
def test_unsupported_flux_choices_are_refused(network, needle):
    with pytest.raises(ConfigError, match=needle):
        setup_training(_config(**network), tiny_flux_components())


@pytest.mark.parametrize(
    ("flow", "modules"),
    [
        # kohya's networks/lora_flux.py and lora_sd3.py both take split_qkv; train_blocks is
        # lora_flux.py's alone
        ({"split_qkv": True}, "networks.lora_flux / networks.lora_sd3"),
        ({"train_blocks": "single"}, "networks.lora_flux"),
    ],
)
def test_lycoris_refuses_a_kohya_module_argument_naming_the_modules_that_take_it(flow, modules):
    config = Config(
        model={"pretrained_model_name_or_path": "unused"},
        network={"network_module": "lycoris.kohya", "network_dim": 4},
        optimizer={"learning_rate": 1e-4},
        flow=flow,
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    with pytest.raises(ConfigError) as caught:
        tiny_flux_components().family.check_training(config)
    key = next(iter(flow))
    assert f"{key} is an argument of kohya's {modules}, which LyCORIS does not read" in str(
        caught.value
    )
