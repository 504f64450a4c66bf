"""Whether a transformer family's loader reads a model (a cheap look at model_index.json or a
file's header), and the checks of its diffusers folder before loading; shared by the Flux.1 and
SD3 loaders."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from safetensors import SafetensorError, safe_open

from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.flux.tokenizers import t5_tokenizer_files
from library.models.loader import check_weights_file, find_weights, read_json, resolve_model_dir

V = TypeVar("V")


def claims_model(
    model: ModelSection,
    pipeline_class: str,
    transformer_class: str,
    detect: Callable[[Iterable[str]], object | None],
    damaged_marks: re.Pattern,
) -> bool:
    """True for a diffusers folder whose pipeline is ``pipeline_class`` or whose transformer is
    a ``transformer_class`` (so the family's other pipelines get its loader's refusal rather
    than the SD loader's "lacks unet/"), or a .safetensors file whose keys ``detect`` knows.

    A damaged file (truncated, a broken header) whose header text still shows key names
    matching ``damaged_marks`` is claimed too, so its error names the family and the key."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        return _folder_holds(path, pipeline_class, transformer_class)
    if path.is_file() and path.suffix.lower() == ".safetensors":
        keys = _file_keys(path)
        if keys is None:
            return damaged_marks.search(_header_text(path)) is not None
        return detect(keys) is not None
    return False


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


def _folder_holds(path: Path, pipeline_class: str, transformer_class: str) -> bool:
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # not a folder of ours to judge: the SD loader reports it
    if not isinstance(index, dict):
        return False
    transformer = index.get("transformer")
    return index.get("_class_name") == pipeline_class or (
        isinstance(transformer, list) and transformer_class in transformer
    )


def _file_keys(path: Path) -> list[str] | None:
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError):
        return None


def checked_pipeline_folder(
    path: Path,
    required: dict[str, str | None],
    weights: dict[str, str],
    pipeline_class: str,
    t5_subfolder: str | None,
    family: str,
) -> tuple[Path, Path | None, dict]:
    """(model folder, its T5 tokenizer folder, the transformer's config.json) of a diffusers
    ``pipeline_class`` folder, after checking its parts and the header of every weights file
    (``weights``: subfolder -> weights file stem), so a broken folder fails before minutes of
    loading. ModelError naming the folder otherwise. ``t5_subfolder`` None: the T5 tokenizer
    comes from elsewhere (t5_tokenizer_path), and the folder's is not looked at."""
    model_dir = resolve_model_dir(str(path), required)
    index = read_json(model_dir / "model_index.json")
    if index.get("_class_name") != pipeline_class:
        raise ModelError(
            f"{model_dir} holds a {index.get('_class_name')}; only text-to-image {family} "
            f"({pipeline_class}) can be trained"
        )
    for sub, stem in weights.items():
        for file in find_weights(model_dir / sub, stem)[0]:
            check_weights_file(file, family)
    t5_tokenizer = None
    if t5_subfolder is not None:
        t5_dir = model_dir / t5_subfolder
        if not t5_dir.is_dir():
            raise ModelError(
                f"{model_dir} lacks the {t5_subfolder}/ subfolder; the diffusers folder is "
                "incomplete (or set t5_tokenizer_path in [flow])"
            )
        t5_tokenizer = t5_tokenizer_files(t5_dir, "the diffusers folder is incomplete")
    return model_dir, t5_tokenizer, read_json(model_dir / "transformer" / "config.json")


def without(parts: Mapping[str, V], skip: set[str]) -> dict[str, V]:
    """``parts`` (subfolder -> anything) without the subfolders in ``skip``."""
    return {sub: value for sub, value in parts.items() if sub not in skip}


def part_config(plans: Mapping, key: str, folder: Path, base: Callable[[], dict]) -> dict:
    """The config of the part [flow] ``key`` names: its file's plan's when the key is set
    (``plans``), else the folder's config.json over ``base()`` (the full-size model's)."""
    if key in plans:
        return plans[key].config
    return {**base(), **read_json(folder / "config.json")}


def part_source(plans: Mapping, key: str, folder: Path) -> str:
    """How messages name the part [flow] ``key`` names: its file, or the folder's subfolder."""
    return f"{key} = {plans[key].file.path}" if key in plans else str(folder)
