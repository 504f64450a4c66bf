"""FLUX.2's entry in the family registry: what shared code asks of it before loading it.

Readable without torch or diffusers: the loader and the family class are imported on first use."""

from __future__ import annotations

from library.models.families.family_entry import (
    Deferred,
    FamilyEntry,
    LoraFiles,
    ToolFacts,
)
from library.models.families.text_encoder_keys import TextEncoderFileKeys
from library.training.flow_keys import SIGMA_KEYS

_LINE = "FLUX.2"
_PACKAGE = "library.models.families.flux2"
# The [flow] keys FLUX.2 reads: the flow-matching draw (objective.py), dev's guidance input and
# the text-encoder file beside a transformer file, and which release it is (musubi-tuner's
# model_version, checked against the files: spec.inspect).
FLOW_KEYS = frozenset(SIGMA_KEYS) | {"guidance_scale", "text_encoder", "model_version"}

# Each release: musubi-tuner's model_version value -> (our variant name, its label)
_RELEASES = {
    "dev": ("flux2-dev-32b", "FLUX.2 [dev]"),
    "klein-4b": ("flux2-klein-4b", "FLUX.2 [klein] 4B, distilled"),
    "klein-base-4b": ("flux2-klein-4b-base", "FLUX.2 [klein] base 4B"),
    "klein-9b": ("flux2-klein-9b", "FLUX.2 [klein] 9B, distilled"),
    "klein-base-9b": ("flux2-klein-9b-base", "FLUX.2 [klein] base 9B"),
}

FLUX2 = FamilyEntry(
    name="flux2",
    label="FLUX.2",
    models=_LINE,
    lines=(_LINE,),
    family=Deferred(f"{_PACKAGE}.family:Flux2Family").get,
    claims=Deferred(f"{_PACKAGE}.family:claims_flux2"),
    load=Deferred(f"{_PACKAGE}.family:load_flux2"),
    reads_vae=True,
    # musubi-tuner's LoRA module for FLUX.2 (its files say ss_network_module so)
    network_module="networks.lora_flux_2",
    flow_matching=True,
    config_keys=(TextEncoderFileKeys,),
    flow_keys=FLOW_KEYS,
    # musubi-tuner's FLUX.2 draw: flux_shift on FLUX.2's own tokens (spec.Flux2FlowObjective)
    timestep_draws=("flux2_shift",),
    # musubi-tuner's --model_version values (checked against the files: spec.inspect)
    model_versions={
        version: label.removeprefix("FLUX.2 ") for version, (_, label) in _RELEASES.items()
    },
    lora_files=LoraFiles(
        # the shared modulation exists in FLUX.2 alone (FLUX.1's blocks modulate themselves);
        # a file of the blocks alone has FLUX.1's names, so no architecture refuses it by them
        denoiser_marks=(
            ("lora_unet_double_stream_modulation", _LINE),
            ("lora_unet_single_stream_modulation", _LINE),
        ),
    ),
    tool=ToolFacts(
        component_options={"text_encoder": "the text encoder file beside a transformer file"},
        variant_labels=dict(_RELEASES.values()),
        version_marks=(("flux2", _LINE),),
        to_original=Deferred(f"{_PACKAGE}.names:to_original"),
        layout_names={"kohya": "kohya's lora_unet_<original path>, also musubi-tuner's"},
    ),
)
