"""Reading a model's files, offline and checked: what every family's loader shares.

The checks that turn a broken file or folder into a one-line ModelError naming the path and the
fix (a diffusers folder's parts, its weights files and their shards, JSON configs, tokenizer
folders), checked before any weights are read where possible; reading one component of a
diffusers folder in one dtype; and shapes_only(), inside which the loaders build every module
on the meta device and read no weight (the dry run). The loaded parts are
library.models.components.Components; which family reads a model is library.models.loader's.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from library.errors import ModelError, one_line

_WEIGHT_STEMS = {"unet": "diffusion_pytorch_model", "vae": "diffusion_pytorch_model"}
LOAD_ERRORS = (
    OSError,
    ValueError,
    RuntimeError,
    KeyError,
    EOFError,
    pickle.UnpicklingError,
    SafetensorError,
)


def model_fingerprint(model_dir: str | Path) -> str:
    """A short stable name of the model for metadata (ss_sd_model_name): its folder name."""
    path = Path(model_dir).expanduser()
    return path.name or path.resolve().name


def resolve_model_dir(path_text: str, required: Mapping[str, str | None]) -> Path:
    """The model folder as an absolute path, after checking it is a complete diffusers folder.

    ``required`` maps each subfolder that must exist to the file that must be in it (None: a
    tokenizer folder, checked by check_tokenizer_files).
    """
    path = Path(path_text).expanduser().absolute()
    if path.is_file():
        raise ModelError(
            f"{path} is neither a diffusers folder nor a .safetensors/.ckpt checkpoint; point "
            "pretrained_model_name_or_path at one of those"
        )
    if not path.is_dir():
        raise ModelError(
            f"model folder {path} does not exist; set pretrained_model_name_or_path to a local "
            "diffusers folder (nothing is downloaded)"
        )
    if not (path / "model_index.json").is_file():
        raise ModelError(
            f"{path} has no model_index.json, so it is not a diffusers model folder; point "
            "pretrained_model_name_or_path at the folder that contains model_index.json"
        )
    for sub, needed in required.items():
        if not (path / sub).is_dir():
            raise ModelError(
                f"{path} lacks the {sub}/ subfolder; the diffusers folder is incomplete"
            )
        if needed and not (path / sub / needed).is_file():
            raise ModelError(f"{path / sub} lacks {needed}; the diffusers folder is incomplete")
        if sub.startswith("tokenizer"):
            check_tokenizer_files(path / sub)
    return path


def check_tokenizer_files(folder: Path) -> None:
    # transformers builds an empty tokenizer from an empty folder without complaint.
    has_bpe = (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    if not (has_bpe or (folder / "tokenizer.json").is_file()):
        raise ModelError(
            f"{folder} lacks vocab.json + merges.txt (or tokenizer.json); the diffusers folder "
            "is incomplete"
        )


def read_json(path: Path) -> dict:
    """A JSON object file; ModelError naming it when it is unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read {path}: {one_line(exc)}; restore the file") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object; restore the file")
    return data


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Forbid hub access while loading, in case a library would otherwise look something up."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_SHAPES_ONLY = contextvars.ContextVar("shapes_only", default=False)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """While inside, the loaders build every module with its real shapes and dtypes on the meta
    device and read no weight (only configs, file headers and tokenizers): what the dry run's
    memory estimate needs, in a second or two for any model."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def reads_weights() -> bool:
    """False inside shapes_only()."""
    return not _SHAPES_ONLY.get()


def empty_from_folder(cls, folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    """``cls`` (a diffusers or transformers model class) built from ``folder``'s config on the
    meta device, in ``dtype``: the module load_weights would give, without its weights."""
    with offline():
        if hasattr(cls, "load_config"):  # diffusers
            config = cls.load_config(str(folder), local_files_only=True)
            with torch.device("meta"):
                module = cls.from_config(config)
        else:  # transformers
            config = cls.config_class.from_pretrained(str(folder), local_files_only=True)
            with torch.device("meta"):
                module = cls(config)
    return module.to(dtype)


def load_weights(
    cls, model_dir: Path, sub: str, dtype: torch.dtype, stem: str | None = None
) -> torch.nn.Module:
    """Load one model component, after checking its weights files are whole.

    ``stem`` names the weights file (default: by ``sub``, diffusion_pytorch_model or model).
    Inside shapes_only(), the component is built from its config on the meta device instead.
    """
    files, variant = find_weights(model_dir / sub, stem or _WEIGHT_STEMS.get(sub, "model"))
    if not reads_weights():
        try:
            return empty_from_folder(cls, model_dir / sub, dtype)
        except LOAD_ERRORS as exc:
            raise ModelError(
                f"cannot read the config in {model_dir / sub}: {one_line(exc)}; re-download "
                "or re-convert the model"
            ) from None
    for file in files:
        check_weights_file(file)
    try:
        module = cls.from_pretrained(
            str(model_dir),
            subfolder=sub,
            dtype=dtype,
            variant=variant,
            use_safetensors=files[0].suffix == ".safetensors",
            local_files_only=True,
        )
    except LOAD_ERRORS as exc:
        names = ", ".join(str(f) for f in files)
        raise ModelError(
            f"cannot load {names}: {one_line(exc)}; re-download or re-convert the model"
        ) from None
    # Some classes keep chosen layers in float32 on load; the caller asked for one dtype. Cast
    # only then, since diffusers warns about any .to(dtype) of a loaded model.
    tensors = [*module.parameters(), *module.buffers()]
    if any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        module.to(dtype)
    return module


def find_weights(folder: Path, stem: str) -> tuple[list[Path], str | None]:
    """The weights files from_pretrained will read, and the variant ("fp16") to ask for."""
    for variant in (None, "fp16"):
        infix = f".{variant}" if variant else ""
        single = folder / f"{stem}{infix}.safetensors"
        if single.is_file():
            return [single], variant
        index = folder / f"{stem}.safetensors.index{infix}.json"
        if index.is_file():
            return _shards(index), variant
        pickled = folder / f"{stem}{infix}.bin"
        if pickled.is_file():
            return [pickled], variant
    raise ModelError(
        f"{folder} has no weights file (expected {stem}.safetensors); the diffusers folder is "
        "incomplete"
    )


def _shards(index: Path) -> list[Path]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ModelError(f"{index} has no weight_map; restore the file")
    shards = [index.parent / name for name in sorted(set(weight_map.values()))]
    for shard in shards:
        if not shard.is_file():
            raise ModelError(f"{shard} (listed in {index.name}) is missing; re-download the model")
    return shards


def check_weights_file(file: Path, family: str | None = None) -> None:
    """safetensors validates its header against the file length: truncation shows up here.
    ``family`` names the model in the message."""
    if not file.name.endswith(".safetensors"):
        return
    try:
        with safe_open(str(file), framework="pt"):
            pass
    except (SafetensorError, OSError) as exc:
        model = f"{family} model" if family else "model"
        raise ModelError(
            f"weights file {file} is corrupt or truncated ({one_line(exc)}); re-download or "
            f"re-convert the {model}"
        ) from None


def read_tokenizer(cls, folder: Path, needs: str, what: str = "tokenizer"):
    """``cls.from_pretrained(folder)`` offline; ModelError naming ``what`` and the folder, and
    the files such a tokenizer folder ``needs``, when it cannot be read."""
    try:
        return cls.from_pretrained(str(folder), local_files_only=True)
    except LOAD_ERRORS + (TypeError,) as exc:
        raise ModelError(
            f"cannot load the {what} in {folder}: {one_line(exc)}; it needs {needs}"
        ) from None
