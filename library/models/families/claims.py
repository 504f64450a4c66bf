"""Whether a transformer family's loader reads a model (a cheap look at model_index.json or a
file's header), and the checks of its diffusers folder before loading; shared by the Flux.1 and
SD3 loaders."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from safetensors import SafetensorError, safe_open

from library.config.schema import ModelSection
from library.errors import ModelError


def claims_model(
    model: ModelSection,
    pipeline_class: str,
    transformer_class: str,
    detect: Callable[[Iterable[str]], object | None],
) -> bool:
    """True for a diffusers folder whose pipeline is ``pipeline_class`` or whose transformer is
    a ``transformer_class`` (so the family's other pipelines get its loader's refusal rather
    than the SD loader's "lacks unet/"), or a .safetensors file whose keys ``detect`` knows."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        return _folder_holds(path, pipeline_class, transformer_class)
    if path.is_file() and path.suffix.lower() == ".safetensors":
        keys = _file_keys(path)
        return keys is not None and detect(keys) is not None
    return False


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
    t5_subfolder: str,
    family: str,
) -> tuple[Path, Path, dict]:
    """(model folder, its T5 tokenizer folder, the transformer's config.json) of a diffusers
    ``pipeline_class`` folder, after checking its parts and the header of every weights file
    (``weights``: subfolder -> weights file stem), so a broken folder fails before minutes of
    loading. ModelError naming the folder otherwise."""
    from library.models.families.flux_tokenizers import t5_tokenizer_files
    from library.models.loader import check_weights_file, find_weights, read_json, resolve_model_dir

    model_dir = resolve_model_dir(str(path), required)
    t5_dir = model_dir / t5_subfolder
    if not t5_dir.is_dir():
        raise ModelError(
            f"{model_dir} lacks the {t5_subfolder}/ subfolder; the diffusers folder is incomplete"
        )
    index = read_json(model_dir / "model_index.json")
    if index.get("_class_name") != pipeline_class:
        raise ModelError(
            f"{model_dir} holds a {index.get('_class_name')}; only text-to-image {family} "
            f"({pipeline_class}) can be trained"
        )
    for sub, stem in weights.items():
        for file in find_weights(model_dir / sub, stem)[0]:
            check_weights_file(file)
    t5_tokenizer = t5_tokenizer_files(t5_dir, "the diffusers folder is incomplete")
    return model_dir, t5_tokenizer, read_json(model_dir / "transformer" / "config.json")
