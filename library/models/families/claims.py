"""Whether a family's loader reads a model: a cheap look at model_index.json or a
file's header, shared by the families' ``claims`` functions."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from safetensors import SafetensorError, safe_open

from library.config.model_schema import ModelSection
from library.errors import ModelError


def claims_model(
    model: ModelSection,
    pipeline_class: str,
    transformer_class: str,
    detect: Callable[[Iterable[str]], object | None],
    damaged_marks: re.Pattern,
    family: str,
) -> bool:
    """True for a diffusers folder whose pipeline is ``pipeline_class``, or a .safetensors file
    whose keys ``detect`` knows. ModelError for a folder of another pipeline whose transformer
    is a ``transformer_class`` (the family's Fill, Control, ... pipelines): only
    ``pipeline_class`` trains, said while the plan is made (``family``: the models' name).

    A damaged file (truncated, a broken header) whose header text still shows key names
    matching ``damaged_marks`` is claimed too, so its error names the family and the key."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        if not _folder_holds(path, pipeline_class, transformer_class):
            return False
        found = folder_pipeline(path)
        if found != pipeline_class:
            raise other_pipeline_error(path, found, pipeline_class, family)
        return True
    return file_claimed(path, detect, damaged_marks)


def other_pipeline_error(
    path: Path, found: str | None, pipeline_class: str, family: str
) -> ModelError:
    """A folder holding the ``found`` pipeline where only ``pipeline_class`` trains."""
    return ModelError(
        f"{path} holds a {found}; only text-to-image {family} ({pipeline_class}) can be trained"
    )


def file_claimed(
    path: Path, detect: Callable[[Iterable[str]], object | None], damaged_marks: re.Pattern
) -> bool:
    """True for a .safetensors file whose keys ``detect`` knows, or a damaged one whose header
    text still shows key names matching ``damaged_marks``."""
    if not (path.is_file() and path.suffix.lower() == ".safetensors"):
        return False
    keys = file_keys(path)
    if keys is None:
        return damaged_marks.search(_header_text(path)) is not None
    return detect(keys) is not None


# A damaged file's header is read up to this size: a FLUX.1 or SD3 header is well under 1 MB.
_HEADER_LIMIT = 16 << 20


def _header_text(path: Path) -> str:
    """As much of a safetensors file's JSON header as the file holds (its first 8 bytes are the
    header's length), as text; "" when there is none."""
    try:
        with open(path, "rb") as file:
            size = int.from_bytes(file.read(8), "little")
            return file.read(min(size, _HEADER_LIMIT)).decode("utf-8", errors="replace")
    except OSError:
        return ""


def model_index(path: Path) -> dict:
    """A folder's model_index.json; {} when it has none that reads as a JSON object (no family
    claims the folder: family_choice reports it)."""
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return index if isinstance(index, dict) else {}


def folder_pipeline(path: Path) -> str | None:
    """The pipeline class a diffusers folder's model_index.json names (None: none)."""
    name = model_index(path).get("_class_name")
    return name if isinstance(name, str) else None


def _folder_holds(path: Path, pipeline_class: str, transformer_class: str) -> bool:
    index = model_index(path)
    transformer = index.get("transformer")
    return index.get("_class_name") == pipeline_class or (
        isinstance(transformer, list) and transformer_class in transformer
    )


def file_keys(path: Path) -> list[str] | None:
    """The tensor names of a safetensors file; None when it does not read as one."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError):
        return None
