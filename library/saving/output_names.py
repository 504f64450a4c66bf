"""The file and folder names an output_name owns in output_dir, and the endings an output_name
may therefore not have.

An output name N owns ``N.safetensors``, ``N-ema.safetensors``, ``N-state``, the diffusers folder
``N`` and the numbered saves ``N-stepXXXXXXXX`` / ``N-XXXXXX`` (each with ``.safetensors``,
``-ema.safetensors``, ``-state``); a model's denoiser experts' weights carry the expert's
name before the suffix (``N_high_noise.safetensors``, ``N-step00000500_low_noise-ema.safetensors``,
EXPERT_TAGS); beside them a run keeps ``N-summary.json`` and its lock
``N.lock``. A second name that ends like one of these (``N-step00000002``, ``N-ema``,
``N-000003``, ``N-state``, ...) would share files with N: its final file would be one of N's
step files, N would prune it or refuse it as its own, and the two runs would hold different
locks. Such names are refused when the config loads, which makes the sets of names of any two
accepted output names disjoint, so one lock per name is enough to keep two runs apart.
"""

from __future__ import annotations

import re

WEIGHTS = ".safetensors"
SUMMARY_SUFFIX = "-summary.json"
LOCK_SUFFIX = ".lock"
# The expert a weights file is for, between its name and its suffix (library.models.experts).
EXPERT_TAGS = ("_high_noise", "_low_noise")
_TAG = "(?:_high_noise|_low_noise)?"
STEP = re.compile(rf"-step(\d{{8}})(-state|{_TAG}-ema\.safetensors|{_TAG}\.safetensors)?$")
EPOCH = re.compile(rf"-(\d{{6}})(-state|{_TAG}-ema\.safetensors|{_TAG}\.safetensors)?$")
_PLAIN = (
    WEIGHTS, "-ema.safetensors", "-state", "",
    *(f"{tag}{end}" for tag in EXPERT_TAGS for end in (WEIGHTS, "-ema.safetensors")),
)  # fmt: skip
# Every ending that makes a name one of another name's outputs (see the module docstring):
# the numbered and EMA forms end in "-stepXXXXXXXX", "-XXXXXX" or "-ema"; the others are
# the suffixes themselves.
_RESERVED = re.compile(
    r"(-ema|-state|-step\d{8}|-\d{6}|\.safetensors|-summary\.json|\.lock|_high_noise|_low_noise)$"
)
_STRIPPED = (WEIGHTS, "-ema", "-state", SUMMARY_SUFFIX, LOCK_SUFFIX)


def expert_file(weights, expert: str):
    """The weights file of ``expert`` (a Path) for a save whose one-denoiser file is
    ``weights``: ``run.safetensors`` -> ``run_high_noise.safetensors``,
    ``run-ema.safetensors`` -> ``run_high_noise-ema.safetensors``."""
    stem = weights.name.removesuffix(WEIGHTS)
    ema = "-ema" if stem.endswith("-ema") else ""
    return weights.with_name(f"{stem.removesuffix(ema)}_{expert}{ema}{WEIGHTS}")


def is_output(name: str, entry: str) -> bool:
    """Whether ``entry`` (a name in output_dir) is one of output_name ``name``'s outputs: the
    final and numbered weights, EMA weights, states and diffusers folders."""
    if not entry.startswith(name):
        return False
    rest = entry[len(name) :]
    return rest in _PLAIN or bool(STEP.fullmatch(rest)) or bool(EPOCH.fullmatch(rest))


def reserved_ending(name: str) -> str | None:
    """The ending of ``name`` that another output name's files have, or None."""
    match = _RESERVED.search(name)
    return match.group(1) if match and match.start() > 0 else None


def owner_of(entry: str) -> str:
    """The output name whose outputs ``entry`` would be one of (``x-step00000002-ema.safetensors``
    -> ``x``); ``entry`` itself for a name that ends in no output suffix."""
    name = entry
    for suffix in _STRIPPED:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            if suffix == WEIGHTS and name.endswith("-ema") and len(name) > 4:
                name = name[:-4]
            break
    for tag in EXPERT_TAGS:
        if name.endswith(tag) and len(name) > len(tag):
            name = name[: -len(tag)]
    numbered = STEP.search(name) or EPOCH.search(name)
    if numbered and numbered.group(2) is None and numbered.start() > 0:
        name = name[: numbered.start()]
    return name
