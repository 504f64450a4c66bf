"""FLUX.1 Kontext [dev]'s kit for the family conformance suite: FLUX.1 dev's (the same
transformer, files and names), on a FluxKontextPipeline folder; its single transformer file is
named Kontext by model_type. Sampling and the loss with a reference image are checked against
FluxKontextPipeline in tests/models/kontext/, which build the reference images these need."""

from __future__ import annotations

from dataclasses import replace

from library.config.flow_schema import FlowSection
from library.models.families.kontext.family import kontext_family
from library.models.families.kontext.sampling import PIPELINE
from tests.kits.flux.kit import KIT as FLUX_KIT
from tests.kits.flux.kit import LORA_MODE as FLUX_LORA
from tests.kits.flux_kontext.tiny import write_tiny_kontext_folder

_WITH_REFERENCES = "tests/models/kontext/ checks it with a reference image against the pipeline"


def _single_files(path, variant, seed):
    model, flow = FLUX_KIT.write_single_files(path, variant, seed)
    return model, {**flow, "model_type": "flux_kontext"}


KIT = replace(
    FLUX_KIT,
    variants=("dev",),
    write_folder=lambda path, variant, seed: write_tiny_kontext_folder(path, seed),
    pipeline=lambda variant: PIPELINE,
    family=lambda variant, modules: kontext_family(FlowSection()),
    write_single_files=_single_files,
    sample_cases=None,
    loss_cases=None,
    loss_reference=None,
    # FLUX.1's LoRA mode on images with references of two sizes (two groups of micro-batches),
    # the transformer alone
    distributed=(
        replace(
            FLUX_LORA,
            name="kontext-lora",
            keys={**FLUX_LORA.keys, "network_args": [], "network_train_unet_only": True},
            holds=(),
            only=("lora_unet_",),
            references=True,
        ),
    ),
    skips={"sample": _WITH_REFERENCES, "loss": _WITH_REFERENCES},
)
