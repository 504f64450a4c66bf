"""kohya key names, export/import round trips and the import errors users can hit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from library.errors import CheckpointError
from library.networks.kohya_keys import export_lora, import_lora
from library.networks.kohya_names import kohya_name
from library.networks.lora import (
    LoraSpec,
    apply_lora,
    lora_layers,
    randomize_lora,
    set_lora_scale,
)
from library.saving.lora_file import read_lora_file, save_lora_file

SUFFIXES = (".lora_down.weight", ".lora_up.weight", ".alpha")
TE_LAYERS = (
    "self_attn_q_proj",
    "self_attn_k_proj",
    "self_attn_v_proj",
    "self_attn_out_proj",
    "mlp_fc1",
    "mlp_fc2",
)


def _expected_unet_names(plain_unet: nn.Module, conv: bool) -> dict[str, nn.Module]:
    """kohya names written out by hand: walk the un-adapted model's blocks by class name."""
    blocks = ("Transformer2DModel",) + (
        ("ResnetBlock2D", "Downsample2D", "Upsample2D") if conv else ()
    )
    names = {}
    for path, module in plain_unet.named_modules():
        if type(module).__name__ not in blocks:
            continue
        for sub, layer in module.named_modules():
            if isinstance(layer, nn.Linear) or (
                isinstance(layer, nn.Conv2d)
                and (
                    conv
                    and type(module).__name__ != "Transformer2DModel"
                    or layer.kernel_size == (1, 1)
                )
            ):
                names["lora_unet_" + f"{path}.{sub}".replace(".", "_")] = layer
    return names


def _randomized(model, kind, spec, seed):
    apply_lora(model, kind, spec)
    randomize_lora(model, torch.Generator().manual_seed(seed), std=0.1)
    return model


def test_kohya_name():
    assert kohya_name("lora_unet", "up_blocks.3.attentions.2.proj_out") == (
        "lora_unet_up_blocks_3_attentions_2_proj_out"
    )
    assert kohya_name("lora_te_", "text_model.encoder.layers.11.mlp.fc2") == (
        "lora_te_text_model_encoder_layers_11_mlp_fc2"
    )


@pytest.mark.parametrize("conv", [False, True])
def test_unet_keys_match_the_format(unet, conv):
    expected = _expected_unet_names(unet, conv)
    spec = LoraSpec(4, 2.0, conv_dim=3 if conv else None, conv_alpha=1.5 if conv else None)
    apply_lora(unet, "unet", spec)
    tensors = export_lora({"lora_unet": unet})
    assert set(tensors) == {name + s for name in expected for s in SUFFIXES}
    assert len(tensors) == 3 * (48 + (31 if conv else 0))
    for name, layer in expected.items():
        down, up = tensors[f"{name}.lora_down.weight"], tensors[f"{name}.lora_up.weight"]
        alpha = tensors[f"{name}.alpha"]
        is_3x3 = isinstance(layer, nn.Conv2d) and layer.kernel_size == (3, 3)
        rank = 3 if is_3x3 else 4
        if isinstance(layer, nn.Linear):
            assert down.shape == (rank, layer.in_features)
            assert up.shape == (layer.out_features, rank)
        else:
            assert down.shape == (rank, layer.in_channels, *layer.kernel_size)
            assert up.shape == (layer.out_channels, rank, 1, 1)
        assert alpha.shape == () and alpha.dtype == torch.float32
        assert alpha.item() == (1.5 if is_3x3 else 2.0)


def test_text_encoder_keys_match_the_format(text_encoder):
    apply_lora(text_encoder, "text_encoder", LoraSpec(8, 4.0))
    tensors = export_lora({"lora_te": text_encoder})
    names = {f"lora_te_text_model_encoder_layers_{i}_{n}" for i in range(2) for n in TE_LAYERS}
    assert set(tensors) == {name + s for name in names for s in SUFFIXES}
    assert tensors["lora_te_text_model_encoder_layers_1_mlp_fc1.lora_down.weight"].shape == (8, 32)
    assert tensors["lora_te_text_model_encoder_layers_1_mlp_fc1.lora_up.weight"].shape == (64, 8)


def _adapted_pair(unet, text_encoder, spec):
    apply_lora(unet, "unet", spec)
    apply_lora(text_encoder, "text_encoder", LoraSpec(spec.dim, spec.alpha))
    return {"lora_unet": unet, "lora_te": text_encoder}


def test_save_read_import_round_trip(tiny_sd1_parts, tmp_path, unet_inputs, unet_out):
    spec = LoraSpec(4, 1.0, conv_dim=2, conv_alpha=1.0)
    parts = {k: copy.deepcopy(tiny_sd1_parts[k]) for k in ("unet", "text_encoder")}
    source = _adapted_pair(parts["unet"], parts["text_encoder"], spec)
    gen = torch.Generator().manual_seed(3)
    for model in source.values():
        randomize_lora(model, gen, std=0.1)
    set_alpha = {"down_blocks.0.attentions.0.proj_in": 3.0}  # one module with its own alpha
    set_lora_scale(source["lora_unet"], set_alpha)
    exported = export_lora(source)
    path = tmp_path / "round.safetensors"
    save_lora_file(path, exported, {"ss_network_dim": "4"}, torch.float32)
    tensors, metadata = read_lora_file(path)
    assert metadata["ss_network_dim"] == "4"

    fresh = {k: copy.deepcopy(tiny_sd1_parts[k]) for k in ("unet", "text_encoder")}
    target = _adapted_pair(fresh["unet"], fresh["text_encoder"], spec)
    import_lora(target, tensors, str(path))
    again = export_lora(target)
    assert set(again) == set(exported)
    for key, value in exported.items():
        assert torch.equal(again[key], value), key
    layer = lora_layers(target["lora_unet"])["down_blocks.0.attentions.0.proj_in"]
    assert layer.scaling["default"] == 0.75
    assert torch.equal(
        unet_out(target["lora_unet"], unet_inputs), unet_out(source["lora_unet"], unet_inputs)
    )


def test_missing_alpha_means_alpha_equals_rank(unet):
    source = _randomized(unet, "unet", LoraSpec(4, 1.0), seed=0)
    tensors = {
        k: v for k, v in export_lora({"lora_unet": source}).items() if not k.endswith("alpha")
    }
    target = copy.deepcopy(source)
    set_lora_scale(target, dict.fromkeys(lora_layers(target), 1.0))
    import_lora({"lora_unet": target}, tensors, "noalpha.safetensors")
    assert {layer.scaling["default"] for layer in lora_layers(target).values()} == {1.0}


def test_fp16_file_imports_into_float32_adapters(unet):
    source = _randomized(unet, "unet", LoraSpec(4, 1.0), seed=1)
    half = {k: v.half() for k, v in export_lora({"lora_unet": source}).items()}
    target = copy.deepcopy(source)
    randomize_lora(target, torch.Generator().manual_seed(9))
    import_lora({"lora_unet": target}, half, "half.safetensors")
    for key, value in export_lora({"lora_unet": target}).items():
        assert value.dtype == torch.float32
        assert torch.equal(value, half[key].float())


def test_text_encoder_keys_while_training_unet_only(unet, text_encoder):
    source = _adapted_pair(unet, text_encoder, LoraSpec(4, 1.0))
    tensors = export_lora(source)
    unet_only = copy.deepcopy(source["lora_unet"])
    with pytest.raises(CheckpointError) as err:
        import_lora({"lora_unet": unet_only}, tensors, "both.safetensors")
    message = str(err.value)
    assert "both.safetensors" in message and "text encoder" in message
    assert "network_train_unet_only = false" in message
    assert "\n" not in message


def test_rank_mismatch_names_module_ranks_and_fix(unet):
    plain = copy.deepcopy(unet)
    source = _randomized(unet, "unet", LoraSpec(8, 1.0), seed=0)
    tensors = export_lora({"lora_unet": source})
    apply_lora(plain, "unet", LoraSpec(4, 1.0))
    with pytest.raises(CheckpointError) as err:
        import_lora({"lora_unet": plain}, tensors, "r8.safetensors")
    message = str(err.value)
    assert "r8.safetensors" in message and "lora_unet_" in message
    assert "rank 8" in message and "rank is 4" in message and "network_dim = 8" in message


def test_conv_keys_without_conv_dim(unet):
    plain = copy.deepcopy(unet)
    tensors = export_lora({"lora_unet": _randomized(unet, "unet", LoraSpec(4, 1.0, 2), 0)})
    apply_lora(plain, "unet", LoraSpec(4, 1.0))
    with pytest.raises(CheckpointError, match="locon.safetensors.*conv_dim"):
        import_lora({"lora_unet": plain}, tensors, "locon.safetensors")


def test_file_missing_adapted_modules(unet):
    source = _randomized(unet, "unet", LoraSpec(4, 1.0), seed=0)
    tensors = export_lora({"lora_unet": source})
    dropped = "lora_unet_mid_block_attentions_0_proj_out"
    tensors = {k: v for k, v in tensors.items() if not k.startswith(dropped)}
    with pytest.raises(CheckpointError, match=f"part.safetensors: lacks 1 of the 48.*{dropped}"):
        import_lora({"lora_unet": source}, tensors, "part.safetensors")


def test_unknown_tensor_kind(unet):
    source = _randomized(unet, "unet", LoraSpec(4, 1.0), seed=0)
    tensors = export_lora({"lora_unet": source})
    tensors["lora_unet_mid_block_attentions_0_proj_out.dora_scale"] = torch.ones(1)
    with pytest.raises(CheckpointError, match="dora_scale"):
        import_lora({"lora_unet": source}, tensors, "dora.safetensors")


def test_shape_mismatch_names_the_base_model(unet):
    source = _randomized(unet, "unet", LoraSpec(4, 1.0), seed=0)
    tensors = export_lora({"lora_unet": source})
    key = "lora_unet_mid_block_attentions_0_transformer_blocks_0_attn2_to_k.lora_down.weight"
    tensors[key] = torch.zeros(4, 768)
    with pytest.raises(CheckpointError, match="different base model"):
        import_lora({"lora_unet": source}, tensors, "sd2.safetensors")


def test_unet_only_file_while_training_both(unet, text_encoder):
    source = _randomized(copy.deepcopy(unet), "unet", LoraSpec(4, 1.0), seed=0)
    tensors = export_lora({"lora_unet": source})
    both = _adapted_pair(unet, text_encoder, LoraSpec(4, 1.0))
    with pytest.raises(
        CheckpointError,
        match="unet.safetensors: lacks 12 of the 60.*"
        "no text-encoder LoRA; set network_train_unet_only = true",
    ):
        import_lora(both, tensors, "unet.safetensors")


def test_refused_file_changes_nothing(unet):
    source = _randomized(copy.deepcopy(unet), "unet", LoraSpec(4, 1.0), seed=0)
    tensors = export_lora({"lora_unet": source})
    bad = "lora_unet_up_blocks_1_attentions_1_proj_out.lora_up.weight"  # sorts last
    tensors[bad] = torch.zeros(5, 4, 1, 1)
    target = _randomized(unet, "unet", LoraSpec(4, 1.0), seed=1)
    before = export_lora({"lora_unet": target})
    with pytest.raises(CheckpointError, match="different base model"):
        import_lora({"lora_unet": target}, tensors, "bad.safetensors")
    after = export_lora({"lora_unet": target})
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_wrapped_models_export_plain_names(unet):
    source = _randomized(unet, "unet", LoraSpec(4, 1.0), seed=0)
    plain = export_lora({"lora_unet": source})
    wrapped = export_lora({"lora_unet": torch.nn.DataParallel(source)})
    assert set(wrapped) == set(plain)
    import_lora({"lora_unet": torch.nn.DataParallel(source)}, plain, "x.safetensors")
