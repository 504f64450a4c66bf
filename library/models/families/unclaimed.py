"""What a model that no registered family claims is, in one line: a path that does not exist, a
folder that is not a diffusers pipeline or holds a pipeline no family reads, a damaged or
mislabelled .safetensors file, or a file of something else (a LoRA, a lone text encoder).

Asked while the plan is made (family_choice.entry_for), before any weight is read, so a model
no family reads never reaches a family's loader, whose errors would describe it in that
family's terms (a WanPipeline folder "lacking unet/")."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from library.errors import ModelError, one_line
from library.models.families.claims import file_keys
from library.models.families.file_contents import looks_like, sample_keys
from library.models.families.registry import trained_lines
from library.user_files import starts_like_pickle

_KEY = "pretrained_model_name_or_path"
# How the weights of one part of a diffusers folder name their tensors (a UNet, a transformer).
_DIFFUSERS_STARTS = ("down_blocks.", "transformer_blocks.", "unet.down_blocks.")


def unclaimed_error(path_text: str) -> ModelError:
    """The error for the model at ``path_text`` when no family claims it."""
    path = Path(path_text).expanduser().absolute()
    trained = trained_lines("or")
    if not path.exists():
        return ModelError(
            f"{_KEY} = {path} does not exist; set it to a local diffusers folder or model file "
            f"of {trained} (nothing is downloaded)"
        )
    if path.is_dir():
        return ModelError(_folder_problem(path, trained))
    return ModelError(_file_problem(path, trained))


def _folder_problem(path: Path, trained: str) -> str:
    index_file = path / "model_index.json"
    if not index_file.is_file():
        return (
            f"{path} has no model_index.json, so it is not a diffusers model folder; point {_KEY} "
            "at the folder that holds model_index.json, or at a model file"
        )
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"cannot read {index_file}: {one_line(exc)}; restore the file"
    pipeline = index.get("_class_name") if isinstance(index, dict) else None
    if not isinstance(pipeline, str):
        return (
            f"{index_file} names no pipeline (_class_name), so no family of difftune reads "
            f"{path}; restore the file, or point {_KEY} at a model of {trained}"
        )
    return (
        f"{path} holds a {pipeline} (model_index.json), a model no family of difftune reads; "
        f"difftune trains {trained}: point {_KEY} at one of those"
    )


def _file_problem(path: Path, trained: str) -> str:
    if path.suffix.lower() != ".safetensors":
        return (
            f"{path} is neither a diffusers folder nor a .safetensors/.ckpt model file; point "
            f"{_KEY} at a model of {trained}"
        )
    keys = file_keys(path)
    # after the safetensors read: a valid header's length may start with the same byte
    if keys is None and starts_like_pickle(path):
        return (
            f"{path} is a pickle (a torch.save file) under a .safetensors name; difftune does "
            "not read pickles as .safetensors: convert it to safetensors with a tool you trust"
        )
    if keys is None:
        return (
            f"{path} is not a valid safetensors file (corrupt or truncated: "
            f"{_safetensors_problem(path)}); re-download it"
        )
    return (
        f"{path} holds {_describe(keys)}, not a model difftune trains; difftune trains "
        f"{trained}: point {_KEY} at one of those"
    )


def _safetensors_problem(path: Path) -> str:
    """Why safetensors refuses to open ``path``, in one line."""
    try:
        with safe_open(str(path), framework="pt"):
            return "unreadable"
    except (SafetensorError, OSError) as exc:
        return one_line(exc)


def _describe(keys: list[str]) -> str:
    """What a readable file no family claims holds, by its key names."""
    if any(".lora_" in k or k.startswith(("lora_", "lycoris_")) for k in keys):
        return "a LoRA (set network_weights to continue training it)"
    if any(k.startswith(_DIFFUSERS_STARTS) for k in keys):
        return (
            f"one part of a diffusers folder ({sample_keys(keys)}); point {_KEY} at the whole "
            "folder"
        )
    described = looks_like(keys)
    if described.startswith(("keys like", "no tensors")):
        return described
    return f"{described} alone"
