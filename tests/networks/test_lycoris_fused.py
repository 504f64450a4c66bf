"""LyCORIS adapters on FLUX.1's and SD3's transformers (library/networks/lycoris_fused.py): what
is particular to each. The file's math (merged into the original layout and converted back by
diffusers, it is the adapted model) and its read-back are the conformance suite's, for every
family (tests/conformance/test_family_conformance.py).
"""

from __future__ import annotations

import pytest

from library.networks.lycoris.spec import LycorisSpec
from library.networks.lycoris_fused import module_layers
from tests.networks.flux_helpers import TINY, build_flux
from tests.networks.sd3_helpers import build_sd3

LOKR = LycorisSpec(algo="lokr", dim=4, alpha=2.0, factor=4, decompose_both=True)


def _family(kind: str):
    from library.models.families.flux.family import FLUX_SCHNELL
    from library.models.families.sd3.family import sd3_family

    if kind == "flux":
        return FLUX_SCHNELL
    from library.config.flow_schema import FlowSection

    return sd3_family("sd3.5-medium", FlowSection())


def _model(kind: str):
    return build_flux(TINY) if kind == "flux" else build_sd3("sd3.5-medium")


def test_sd3_modules_have_lycoris_embedder_classes_and_swapped_halves():
    """LyCORIS' PatchEmbed and TimestepEmbedding classes; the pre-only block's modulation."""
    modules = _family("sd3").lycoris_modules(_model("sd3"), "full")
    names = {m.name for m in modules}
    assert {"lora_unet_x_embedder_proj", "lora_unet_t_embedder_mlp_0"} <= names
    assert any(m.swapped_halves for m in modules)


def test_a_file_of_another_preset_is_refused():
    from library.errors import CheckpointError

    family = _family("flux")
    model = _model("flux")
    family.apply_lycoris(model, "unet", LOKR, "attn-only")
    assert all("_attn_" in name for name in module_layers(model))
    full = _model("flux")
    family.apply_lycoris(full, "unet", LOKR, "full")
    with pytest.raises(CheckpointError, match="not LyCORIS modules of this model and preset"):
        family.load_lora_tensors(
            {"lora_unet": model}, family.lora_tensors({"lora_unet": full}), "f"
        )


def test_adapter_parameters_train_and_nothing_else():
    family, model = _family("sd3"), _model("sd3")
    family.apply_lycoris(model, "unet", LOKR, "full")
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(name.startswith("lycoris_modules.") for name in trained)
    # the base weights are the model's own, once: the views store nothing
    assert sum(p.numel() for p in model.parameters() if not p.requires_grad) == sum(
        p.numel() for p in _model("sd3").parameters()
    )
