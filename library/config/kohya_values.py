"""Values as kohya's loader reads them: what means "not set", what means "off", and truthy ints.

sd-scripts hands every TOML value to argparse's namespace and tests most of them with
``if args.key:`` or ``is None``. Files written by its GUIs rely on that: an empty string is an
unset path, ``resume = false`` is no resume, ``min_snr_gamma = 0`` is no Min-SNR weighting and
``persistent_data_loader_workers = 1`` is true. ``normalise`` maps such values to what they mean
here, so the typed schema can stay strict about everything else.
"""

from __future__ import annotations

import types
import typing
from typing import Literal

UNSET = object()  # the value means "not set": the key takes its default

# Optional numbers kohya tests for truth: 0 means off (``if args.min_snr_gamma:``).
ZERO_MEANS_OFF = frozenset(
    {
        "min_snr_gamma",
        "ddp_timeout",
        "conv_dim",
        "scale_weight_norms",
        "lr_scheduler_timescale",
        "save_last_n_steps_state",
        "save_last_n_epochs_state",
    }
)


def _members(annotation: object) -> tuple[object, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is_text(member: object) -> bool:
    return member is str or typing.get_origin(member) is Literal


def normalise(key: str, value: object, annotation: object | None) -> object:
    """The value ``key = value`` stands for, or UNSET when it means "not set".

    ``annotation`` is the key's schema type (None for keys the schema does not type, such as
    known-unsupported kohya keys: only the empty string is mapped for those).
    - "" is unset for every key (kohya's GUIs write "" for every empty field);
    - false is unset for a key that holds text or nothing (``resume = false``);
    - [] is unset for an optional key that may hold a list (``text_encoder_lr = []``);
    - 0 is unset for the optional numbers kohya tests for truth (ZERO_MEANS_OFF);
    - 0 and 1 are false and true for true/false keys (kohya tests them for truth).
    """
    if isinstance(value, str) and value == "":
        return UNSET
    if annotation is None:
        return value
    members = _members(annotation)
    optional = type(None) in members
    if value is False and optional and bool not in members and any(map(_is_text, members)):
        return UNSET
    if value == [] and optional:  # kohya: an empty list of rates is no rate
        return UNSET
    if key in ZERO_MEANS_OFF and optional and _is_zero(value):
        return UNSET
    if bool in members and type(value) is int and value in (0, 1):
        return bool(value)
    return value


def _is_zero(value: object) -> bool:
    return type(value) in (int, float) and value == 0
