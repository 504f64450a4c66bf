"""SDXL LoRA files: SGM-layout UNet names, lora_te1_/lora_te2_ prefixes, import and merge back."""

from __future__ import annotations

import copy

import pytest
import torch

from library.errors import CheckpointError
from library.models.families.registry import unet_key_layout
from library.networks.kohya_keys import export_lora, import_lora
from library.networks.lora import LoraSpec, apply_lora, randomize_lora
from tests.networks.lora_merge import merge_lora_file

# The tiny SDXL UNet (tests/kits/sd/tiny.py: two levels, two ResNets per level, attention on the
# second level with two transformer layers) in the original SGM numbering, written out by hand:
# input_blocks 1, 2 = level 0 ResNets, 3 = downsampler, 4, 5 = level 1 ResNet + attention;
# middle_block 0, 1, 2 = ResNet, attention, ResNet; output_blocks 0-2 = the deep level's three
# ResNets + attentions (upsampler at 2.2), 3-5 = level 0's three ResNets.
ATTENTIONS = [
    "input_blocks_4_1",
    "input_blocks_5_1",
    "middle_block_1",
    "output_blocks_0_1",
    "output_blocks_1_1",
    "output_blocks_2_1",
]
PER_TRANSFORMER = [
    f"{attn}_{proj}" for attn in ("attn1", "attn2") for proj in ("to_q", "to_k", "to_v", "to_out_0")
] + ["ff_net_0_proj", "ff_net_2"]
RESNETS = [f"input_blocks_{i}_0" for i in (1, 2, 4, 5)] + ["middle_block_0", "middle_block_2"]
RESNETS += [f"output_blocks_{i}_0" for i in range(6)]
# ResNets whose channel count changes have a 1x1 shortcut: 32 -> 64 going down, and every up
# ResNet (it takes the skip connection concatenated).
SHORTCUTS = ["input_blocks_4_0"] + [f"output_blocks_{i}_0" for i in range(6)]
SAMPLERS = ["input_blocks_3_0_op", "output_blocks_2_2_conv"]


def expected_unet_modules(conv: bool) -> set[str]:
    names = set()
    for block in ATTENTIONS:
        names |= {f"lora_unet_{block}_proj_in", f"lora_unet_{block}_proj_out"}
        for t in range(2):
            names |= {f"lora_unet_{block}_transformer_blocks_{t}_{p}" for p in PER_TRANSFORMER}
    if conv:
        for block in RESNETS:
            for layer in ("in_layers_2", "out_layers_3", "emb_layers_1"):
                names.add(f"lora_unet_{block}_{layer}")
        names |= {f"lora_unet_{block}_skip_connection" for block in SHORTCUTS}
        names |= {f"lora_unet_{s}" for s in SAMPLERS}
    return names


def expected_text_modules(prefix: str, layers: int) -> set[str]:
    parts = ["self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "self_attn_out_proj"]
    parts += ["mlp_fc1", "mlp_fc2"]
    return {
        f"{prefix}_text_model_encoder_layers_{i}_{part}" for i in range(layers) for part in parts
    }


@pytest.fixture(scope="module")
def sdxl_parts():
    from tests.kits.sd.tiny import build_tiny_sdxl_components

    return build_tiny_sdxl_components(seed=0)


def _adapted(sdxl_parts, spec: LoraSpec, seed: int = 5) -> dict[str, torch.nn.Module]:
    models = {
        "lora_unet": copy.deepcopy(sdxl_parts["unet"]).eval(),
        "lora_te1": copy.deepcopy(sdxl_parts["text_encoder"]).eval(),
        "lora_te2": copy.deepcopy(sdxl_parts["text_encoder_2"]).eval(),
    }
    gen = torch.Generator().manual_seed(seed)
    for prefix, model in models.items():
        apply_lora(model, "unet" if prefix == "lora_unet" else "text_encoder", spec)
        randomize_lora(model, gen, std=0.05)
    return models


LOCON = LoraSpec(4, 3.0, conv_dim=2, conv_alpha=1.0)


@pytest.fixture(scope="module")
def locon_models(sdxl_parts):
    """UNet + both encoders with a random LoCon adapter (read-only for the tests)."""
    return _adapted(sdxl_parts, LOCON, seed=1)


def _modules(tensors) -> set[str]:
    return {key.split(".", 1)[0] for key in tensors}


@pytest.mark.parametrize("conv", [False, True], ids=["linear", "locon"])
def test_keys_use_sgm_names_and_sdxl_prefixes(sdxl_parts, locon_models, conv):
    models = locon_models if conv else _adapted(sdxl_parts, LoraSpec(4, 2.0))
    tensors = export_lora(models, unet_key_layout)
    unet = expected_unet_modules(conv)
    te1 = expected_text_modules("lora_te1", 2)
    te2 = expected_text_modules("lora_te2", 3)
    assert len(unet) == (132 if not conv else 132 + 12 * 3 + 7 + 2)
    assert _modules(tensors) == unet | te1 | te2
    assert len(tensors) == 3 * (len(unet) + len(te1) + len(te2))
    for name in unet | te1 | te2:
        for kind in ("lora_down.weight", "lora_up.weight", "alpha"):
            assert f"{name}.{kind}" in tensors
    assert not any("down_blocks" in k or "up_blocks" in k or "mid_block" in k for k in tensors)
    # The docs/formats.md example exists here, with the linear rank; a sampler conv has the conv
    # rank.
    assert (
        tensors[
            "lora_unet_input_blocks_4_1_transformer_blocks_0_attn2_to_k.lora_down.weight"
        ].shape[0]
        == 4
    )
    if conv:
        assert tensors["lora_unet_input_blocks_3_0_op.lora_down.weight"].shape == (2, 32, 3, 3)


def test_unet_names_match_the_original_names_mapping(sdxl_parts, locon_models):
    from library.models.original_names import unet_path_from_original

    models = locon_models
    config = models["lora_unet"].config
    module_paths = {name for name, _ in sdxl_parts["unet"].named_modules()}
    for name in _modules(export_lora({"lora_unet": models["lora_unet"]}, unet_key_layout)):
        original = name.removeprefix("lora_unet_")
        # Underscores inside names (to_q, proj_in, ...) are not dots; find the dotted SGM path
        # whose diffusers counterpart is a module of the plain UNet.
        found = [
            path
            for path in module_paths
            if path and _sgm(path, config).replace(".", "_") == original
        ]
        assert len(found) == 1, name
        assert unet_path_from_original(_sgm(found[0], config), config) == found[0]


def _sgm(path: str, config) -> str:
    from library.models.original_names import unet_path_to_original

    try:
        return unet_path_to_original(path, config)
    except ValueError:
        return ""


def test_import_maps_sgm_names_back(sdxl_parts, locon_models, unet_inputs_sdxl):
    source = locon_models
    tensors = export_lora(source, unet_key_layout)
    target = _adapted(sdxl_parts, LoraSpec(4, 1.0, conv_dim=2, conv_alpha=2.0), seed=2)
    import_lora(target, tensors, "sdxl.safetensors", unet_key_layout)
    again = export_lora(target, unet_key_layout)
    assert again.keys() == tensors.keys()
    for key, value in tensors.items():
        torch.testing.assert_close(again[key], value, rtol=0, atol=0)
    with torch.no_grad():
        ours = target["lora_unet"](*unet_inputs_sdxl[:3], **unet_inputs_sdxl[3]).sample
        theirs = source["lora_unet"](*unet_inputs_sdxl[:3], **unet_inputs_sdxl[3]).sample
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.fixture(scope="module")
def unet_inputs_sdxl():
    gen = torch.Generator().manual_seed(3)
    added = {
        "text_embeds": torch.randn(2, 24, generator=gen),
        "time_ids": torch.tensor([[64.0, 64, 0, 0, 64, 64], [96, 64, 8, 0, 64, 64]]),
    }
    context = torch.randn(2, 77, 80, generator=gen)
    latents = torch.randn(2, 4, 8, 8, generator=gen)
    return latents, torch.tensor([10, 700]), context, {"added_cond_kwargs": added}


def test_merge_into_a_plain_unet_reproduces_the_adapter(sdxl_parts, locon_models, unet_inputs_sdxl):
    models = locon_models
    tensors = export_lora(models, unet_key_layout)
    plain = copy.deepcopy(sdxl_parts["unet"]).eval()
    assert merge_lora_file(plain, tensors, "lora_unet") == len(expected_unet_modules(True))
    with torch.no_grad():
        merged = plain(*unet_inputs_sdxl[:3], **unet_inputs_sdxl[3]).sample
        adapted = models["lora_unet"](*unet_inputs_sdxl[:3], **unet_inputs_sdxl[3]).sample
    torch.testing.assert_close(merged, adapted, rtol=1e-4, atol=1e-5)


def test_text_encoder_weights_without_a_trained_text_encoder(sdxl_parts):
    tensors = export_lora(_adapted(sdxl_parts, LoraSpec(4, 1.0)), unet_key_layout)
    unet_only = {"lora_unet": _adapted(sdxl_parts, LoraSpec(4, 1.0))["lora_unet"]}
    with pytest.raises(CheckpointError, match="network_train_unet_only = false"):
        import_lora(unet_only, tensors, "xl.safetensors", unet_key_layout)


def test_sd1_file_into_sdxl_is_refused(sdxl_parts, tiny_sd1_parts):
    sd1_unet = copy.deepcopy(tiny_sd1_parts["unet"])
    apply_lora(sd1_unet, "unet", LoraSpec(4, 1.0))
    tensors = export_lora({"lora_unet": sd1_unet}, unet_key_layout)
    target = {"lora_unet": _adapted(sdxl_parts, LoraSpec(4, 1.0))["lora_unet"]}
    with pytest.raises(CheckpointError, match="sd1.safetensors: .*different"):
        import_lora(target, tensors, "sd1.safetensors", unet_key_layout)


def test_missing_text_encoder_modules_say_so(sdxl_parts):
    models = _adapted(sdxl_parts, LoraSpec(4, 1.0))
    unet_only = export_lora({"lora_unet": models["lora_unet"]}, unet_key_layout)
    with pytest.raises(CheckpointError, match="no text-encoder LoRA"):
        import_lora(models, unet_only, "unet-only.safetensors", unet_key_layout)
