"""LyCORIS adapters on FLUX.1's and SD3's transformers (library/networks/lycoris_fused.py).

The file names the ORIGINAL model's layers (fused q/k/v, SD3's swapped pre-only modulation), so
the check is the reader's path: merge each file module into the original layout's weight with
LyCORIS' formulas (file_math, itself compared with the lycoris-lora package), convert back to
diffusers' layout (SD3: with diffusers' own converter), and compare with the adapted model,
weight for weight and output for output.
"""

from __future__ import annotations

import copy

import pytest
import torch

from library.networks.lycoris import file_math
from library.networks.lycoris.spec import LycorisSpec
from library.networks.lycoris_fused import module_layers
from tests.networks.flux_helpers import TINY, build_flux, flux_inputs
from tests.networks.sd3_helpers import build_sd3, from_original, to_original

SPECS = {
    "loha-dora": LycorisSpec(algo="loha", dim=4, alpha=2.0, dora_wd=True),
    "lokr": LycorisSpec(algo="lokr", dim=4, alpha=2.0, factor=4, decompose_both=True),
    "locon": LycorisSpec(algo="lora", dim=4, alpha=2.0, use_tucker=True),
}


def _family(kind: str):
    from library.models.families.flux.family import FLUX_SCHNELL
    from library.models.families.sd3.family import sd3_family

    if kind == "flux":
        return FLUX_SCHNELL
    from library.config.flow_schema import FlowSection

    return sd3_family("sd3.5-medium", FlowSection())


def _model(kind: str):
    return build_flux(TINY) if kind == "flux" else build_sd3("sd3.5-medium")


@torch.no_grad()
def _randomize(model, seed: int) -> None:
    """Non-zero values in every adapter tensor (a fresh adapter changes nothing)."""
    gen = torch.Generator().manual_seed(seed)
    for layer in module_layers(model).values():
        for param in layer.adapter_parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)


def _to_original(kind: str, state):
    if kind == "flux":
        from library.models.families.flux.original_keys import transformer_to_original

        return transformer_to_original(state)
    return to_original(state)


def _from_original(kind: str, original):
    if kind == "flux":
        from library.models.families.flux.original_keys import transformer_from_original

        return transformer_from_original(original)
    return from_original(original)  # diffusers' own converter


def _inputs(kind: str, model) -> dict[str, torch.Tensor]:
    if kind == "flux":
        return flux_inputs(TINY)
    config = model.config
    gen = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(1, config.in_channels, 8, 8, generator=gen),
        "encoder_hidden_states": torch.randn(1, 6, config.joint_attention_dim, generator=gen),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim, generator=gen),
        "timestep": torch.tensor([500.0]),
    }


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).sample


@pytest.mark.parametrize("kind", ["flux", "sd3"])
@pytest.mark.parametrize("case", list(SPECS))
def test_file_merged_into_the_original_layout_is_the_adapted_model(kind, case):
    family, model = _family(kind), _model(kind)
    plain = copy.deepcopy(model)
    family.apply_lycoris(model, "unet", SPECS[case], "full")
    _randomize(model, seed=3)
    tensors = family.lora_tensors({"lora_unet": model})

    modules = {m.name: m for m in family.lycoris_modules(plain, "full")}
    names = {key.split(".", 1)[0] for key in tensors}
    assert names == set(modules)
    assert any(m.fused for m in modules.values())
    if kind == "sd3":  # LyCORIS' PatchEmbed and TimestepEmbedding classes
        assert {"lora_unet_x_embedder_proj", "lora_unet_t_embedder_mlp_0"} <= names
        assert any(m.swapped_halves for m in modules.values())

    original = _to_original(kind, plain.state_dict())
    for name, module in modules.items():
        parts = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".")[0] == name}
        key = f"{module.original}.weight"
        original[key] = file_math.merged_weight(original[key], parts).to(original[key].dtype)
    merged = _from_original(kind, original)
    reference = copy.deepcopy(plain)
    reference.load_state_dict(merged)
    inputs = _inputs(kind, plain)
    ours, theirs = _run(model, inputs), _run(reference, inputs)
    assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-4), (ours - theirs).abs().max()
    assert (theirs - _run(plain, inputs)).abs().max() > 1e-3  # the adapters change the output


@pytest.mark.parametrize("kind", ["flux", "sd3"])
def test_file_reads_back_into_fresh_adapters(kind):
    family = _family(kind)
    model = _model(kind)
    family.apply_lycoris(model, "unet", SPECS["loha-dora"], "full")
    _randomize(model, seed=5)
    tensors = family.lora_tensors({"lora_unet": model})
    fresh = _model(kind)
    family.apply_lycoris(fresh, "unet", SPECS["loha-dora"], "full")
    family.load_lora_tensors({"lora_unet": fresh}, tensors, "f.safetensors")
    again = family.lora_tensors({"lora_unet": fresh})
    assert again.keys() == tensors.keys()
    assert all(torch.equal(again[k], tensors[k]) for k in tensors)


def test_a_file_of_another_preset_is_refused():
    from library.errors import CheckpointError

    family = _family("flux")
    model = _model("flux")
    family.apply_lycoris(model, "unet", SPECS["lokr"], "attn-only")
    assert all("_attn_" in name for name in module_layers(model))
    full = _model("flux")
    family.apply_lycoris(full, "unet", SPECS["lokr"], "full")
    with pytest.raises(CheckpointError, match="not LyCORIS modules of this model and preset"):
        family.load_lora_tensors({"lora_unet": model}, family.lora_tensors({"lora_unet": full}), "f")


def test_adapter_parameters_train_and_nothing_else():
    family, model = _family("sd3"), _model("sd3")
    family.apply_lycoris(model, "unet", SPECS["lokr"], "full")
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(name.startswith("lycoris_modules.") for name in trained)
    # the base weights are the model's own, once: the views store nothing
    assert sum(p.numel() for p in model.parameters() if not p.requires_grad) == sum(
        p.numel() for p in _model("sd3").parameters()
    )
