"""What a run trains, as the model's family has it, settled before any weight is read.

Some families' adapters go into the denoiser alone (ModelFamily.DENOISER_ONLY_ADAPTERS: Z-Image,
Qwen-Image, Chroma). There network_train_unet_only = false, kohya's default, cannot be honoured:
left unset it is simply the family's default, the transformer alone, and written false it gets
one warning, as kohya's Chroma trainer and musubi-tuner train the transformer alone too.

A dataset with musubi-tuner's bucketing takes its step of 16 when none is written; musubi-tuner
trains transformers, whose grid that is. A family whose models need a coarser grid (SD's UNets:
ModelFamily.BUCKET_STEP) takes its own step there instead of refusing a value nobody wrote.

The family is known from a cheap look at the model's files (its registry entry's ``claims``).
"""

from __future__ import annotations

from library.config.provenance import DEFAULT, provenance
from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.family_choice import entry_for


def for_family(config: Config) -> tuple[Config, list[str]]:
    """``config`` with what its model's family trains and the bucket steps it runs (the same
    config when nothing changes), and the warnings to show once (without "warning: ").
    ConfigError where the config asks for text-encoder adapters alone and the family has none:
    nothing would train."""
    unwritten = _unwritten_bucket_steps(config)
    net = config.network
    asks_text = net.train_mode == "lora" and not net.network_train_unet_only
    if not (unwritten or asks_text):
        return config, []  # nothing to settle: no look at the model's files
    entry = entry_for(config.model, config.flow)
    family = entry.family_of(config.model, config.flow)
    config = _with_bucket_steps(config, unwritten, family.BUCKET_STEP or family.PIXEL_MULTIPLE)
    reason = family.DENOISER_ONLY_ADAPTERS
    if not asks_text or reason is None:
        return config, []
    adapts = f"{entry.label} LoRAs adapt the transformer only ({reason})"
    if net.network_train_text_encoder_only:
        raise ConfigError(
            f"network_train_text_encoder_only = true: {adapts}, so nothing would train; remove "
            "network_train_text_encoder_only"
        )
    notes = []
    written = provenance(config).source("network_train_unet_only")
    if written != DEFAULT:
        notes.append(
            f"{written}: network_train_unet_only = false: {adapts}; the transformer trains "
            "alone, as kohya's and musubi-tuner's trainers do"
        )
    network = net.model_copy(update={"network_train_unet_only": True})
    return config.model_copy(update={"network": network}), notes


def _unwritten_bucket_steps(config: Config) -> list[int]:
    """The bucketed datasets whose bucket_reso_steps nobody wrote."""
    sources = provenance(config)
    return [
        d
        for d, dataset in enumerate(config.datasets)
        if dataset.enable_bucket
        and sources.source(f"datasets[{d}].bucket_reso_steps") == DEFAULT
    ]


def _with_bucket_steps(config: Config, unwritten: list[int], step: int) -> Config:
    """``config`` with the ``unwritten`` datasets' steps that do not fit ``step`` (the family's
    coarsest grid) raised to it (module docstring); ``config`` itself when none changes."""
    datasets = list(config.datasets)
    for d in unwritten:
        if datasets[d].bucket_reso_steps % step:
            datasets[d] = datasets[d].model_copy(update={"bucket_reso_steps": step})
    if datasets == list(config.datasets):
        return config
    return config.model_copy(update={"datasets": datasets})
