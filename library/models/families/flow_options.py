"""The model options every flow-matching family checks the same way: other families' [flow]
keys, timestep_sampling draws and model_version values, SD 2.x's v2 and zero_terminal_snr are
refused; SD's text and prediction settings that a flow model does not read get a warning."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from library.config.flow_section import SHARED_DRAWS, FlowSection
from library.config.model_schema import ModelSection
from library.config.suggest import show_value
from library.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

# SD settings a flow-matching model does not read, and the values GUIs write into every config
# (left alone without a warning).
IGNORED_SD_SETTINGS = {
    "clip_skip": (None, 1),
    "max_token_length": (None, 75),
    "v_parameterization": (None, False),
}


def check_flow_model_options(
    model: ModelSection, flow: FlowSection, kind: str, label: str, sd_scripts_trains: bool
) -> None:
    """ConfigError for the options a flow-matching family ``kind`` (called ``label``) refuses;
    a warning for the SD settings it ignores (``sd_scripts_trains``: sd-scripts trains the
    family and ignores them too, which the warning says)."""
    for key in type(flow).model_fields:
        owners = flow.readers(key) if getattr(flow, key) is not None else ()
        if owners and kind not in (owner.name for owner in owners):
            names = " and ".join(owner.label for owner in owners)
            raise ConfigError(f"{key} applies to {names} models, not {label}; remove it")
    owner = flow.draw_owner(flow.timestep_sampling)
    if owner is not None and owner.name != kind:
        raise ConfigError(
            f'timestep_sampling = "{flow.timestep_sampling}" is musubi-tuner\'s draw for '
            f"{owner.label}, not {label}; use one of the shared draws ({', '.join(SHARED_DRAWS)})"
        )
    own = flow.model_versions(kind)
    if flow.model_version is not None and flow.model_version not in own:
        raise ConfigError(
            f'model_version = "{flow.model_version}" names no {label} model; set one of '
            f"{', '.join(own)}, or remove it (the files say which model they are)"
        )
    if model.v2:  # sd-scripts stops too: the file asks for an SD 2.x model
        raise ConfigError(f"v2 = true names an SD 2.x model, not {label}; remove it")
    ignored = {
        key: getattr(model, key)
        for key, values in IGNORED_SD_SETTINGS.items()
        if getattr(model, key) not in values
    }
    if ignored:
        log.warning(
            "%s: SD settings, not used by %s; ignored%s",
            ", ".join(f"{key} = {show_value(value)}" for key, value in ignored.items()),
            label,
            ", as sd-scripts does" if sd_scripts_trains else "",
        )
    if model.zero_terminal_snr:
        raise ConfigError(f"zero_terminal_snr applies to DDPM models, not {label}; remove it")


def check_model_version(version: str | None, fits: Sequence[str], files, what: str) -> None:
    """ModelError when [flow] model_version is set and is none of ``fits``, the values the
    model's ``files`` (its folder or file) may be by what they say: ``what`` (e.g. "a
    QwenImagePipeline folder"). Read before any weight, so a wrong value stops the run early."""
    if version is not None and version not in fits:
        values = " or ".join(f'"{fit}"' for fit in fits)
        raise ModelError(
            f'model_version = "{version}" but {files} is {what}; set model_version = {values}, '
            "or remove it"
        )
