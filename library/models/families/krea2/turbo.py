"""Samples of a RAW run drawn on Turbo ([flow] turbo_dit, musubi-tuner's --turbo_dit): for each
sampling round the transformer's base weights are Turbo's, its adapters kept (a LoRA trained on
RAW applied to Turbo, the workflow Krea recommends), and RAW's are put back after; the pipeline
then samples with Turbo's fixed shift and, unless a prompt says otherwise, no guidance."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from library.errors import ModelError
from library.models.families.krea2.keys import TABLE
from library.models.families.name_table import CHECKPOINT_PREFIX
from library.networks.kohya_names import unwrap


def turbo_files(value: str) -> list[Path]:
    """The Turbo transformer's weights files: the file itself, or a folder's transformer/."""
    path = Path(value).expanduser().absolute()
    folder = path / "transformer" if (path / "transformer").is_dir() else path
    found = sorted(folder.glob("*.safetensors")) if path.is_dir() else [path]
    if not found or not all(f.is_file() for f in found):
        raise ModelError(f"turbo_dit = {path}: no Turbo transformer there (turbo.safetensors, or "
                         "a Krea-2-Turbo diffusers folder); set turbo_dit in [flow]")  # fmt: skip
    return found


def _renamed(names) -> dict[str, str]:
    """File name -> diffusers name (Krea's original names or diffusers'; a name neither knows
    is kept, and found missing)."""
    if any(n.startswith("text_fusion.") for n in names):
        return {n: n for n in names}
    return {n: _diffusers_name(n.removeprefix(CHECKPOINT_PREFIX)) for n in names}


def _diffusers_name(name: str) -> str:
    try:
        return TABLE.diffusers_keys(name)[0]
    except ValueError:
        return name


def check_turbo(value: str, transformer: torch.nn.Module) -> None:
    """ModelError naming turbo_dit unless its files hold every weight of ``transformer``, each
    as large (headers only, before any weight is read)."""
    weights = {k: v.numel() for k, v in unwrap(transformer).state_dict().items()}
    sizes = {}
    for file in turbo_files(value):
        with safe_open(str(file), "pt") as f:
            names = _renamed(list(f.keys()))
            for key, name in names.items():
                shape = f.get_slice(key).get_shape()
                sizes[name] = int(torch.Size(shape).numel())
    wrong = sorted(k for k in weights if sizes.get(k) != weights[k])
    if wrong:
        raise ModelError(f"turbo_dit = {value}: {wrong[0]} is missing or of another size; it is "
                         "not the Turbo checkpoint of this Krea 2 transformer")  # fmt: skip


@contextlib.contextmanager
def turbo_weights(denoiser: torch.nn.Module, value: str):
    """``denoiser`` holding Turbo's base weights inside the block (its adapters untouched)."""
    turbo: dict[str, torch.Tensor] = {}
    for file in turbo_files(value):
        state = load_file(str(file))
        turbo.update({name: state[key] for key, name in _renamed(state).items()})
    own = unwrap(denoiser).state_dict(keep_vars=True)
    saved = {}
    with torch.no_grad():
        for name, tensor in own.items():
            plain = name.replace(".base_layer.", ".")
            if plain in turbo:
                saved[name] = tensor.detach().to("cpu", copy=True)
                tensor.copy_(turbo.pop(plain).reshape(tensor.shape))
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value_ in saved.items():
                own[name].copy_(value_)
