"""Samples drawn on another checkpoint's base weights (``ModelFamily.sampling_weights``): for each
sampling round the denoiser's frozen base weights are the other checkpoint's, its adapters kept
(a LoRA trained on one checkpoint previewed where it is used, as Krea 2's RAW LoRAs on Turbo,
musubi-tuner's --turbo_dit), and its own are put back after.

The other checkpoint is a config key's value (``key``): a weights file in the original names of
the family's name table (bare or under ComfyUI's ``model.diffusion_model.``) or diffusers', or a
diffusers folder (its ``transformer/``). It is checked against the loaded denoiser from the
headers alone, before any weight is read; the swap is refused where the base weights are not
stored as they load.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from library.errors import ConfigError, ModelError
from library.models.families.name_table import CHECKPOINT_PREFIX, NameTable
from library.networks.kohya_names import unwrap


def weights_files(key: str, value: str, what: str) -> list[Path]:
    """The other checkpoint's weights files: the file itself, or a folder's transformer/ (or the
    folder's own); ModelError naming ``key`` when there are none. ``what``: the files users
    give, for the message."""
    path = Path(value).expanduser().absolute()
    folder = path / "transformer" if (path / "transformer").is_dir() else path
    found = sorted(folder.glob("*.safetensors")) if path.is_dir() else [path]
    if not found or not all(f.is_file() for f in found):
        raise ModelError(f"{key} = {path}: nothing there is {what}; set {key} in [flow]")
    return found


def diffusers_names(names: list[str], table: NameTable) -> dict[str, str]:
    """File name -> diffusers name: the table's original names renamed, diffusers' kept (a file
    holding any diffusers name of the table's first list is taken as in diffusers' names); a
    name neither knows is kept, and found missing."""
    first = table.lists[0][1] + "."
    if any(n.startswith(first) for n in names):
        return {n: n for n in names}
    renamed = {}
    for name in names:
        try:
            renamed[name] = table.diffusers_keys(name.removeprefix(CHECKPOINT_PREFIX))[0]
        except ValueError:
            renamed[name] = name
    return renamed


def check_same_weights(key: str, value: str, what: str, table: NameTable, denoiser) -> None:
    """ModelError naming ``key`` unless its files hold every weight of ``denoiser``, each as
    large (headers only, before any weight is read)."""
    weights = {k: v.numel() for k, v in unwrap(denoiser).state_dict().items()}
    sizes = {}
    for file in weights_files(key, value, what):
        with safe_open(str(file), "pt") as f:
            for name, renamed in diffusers_names(list(f.keys()), table).items():
                sizes[renamed] = int(torch.Size(f.get_slice(name).get_shape()).numel())
    wrong = sorted(k for k in weights if sizes.get(k) != weights[k])
    if wrong:
        raise ModelError(f"{key} = {value}: {wrong[0]} is missing or of another size; it is "
                         f"not {what} of this model")  # fmt: skip


def check_swap_options(config, key: str, what: str, otherwise: str) -> None:
    """ConfigError for what a swap of base weights cannot do: a full fine-tune (the swap would
    overwrite the trained weights) and base weights stored otherwise than as they load.
    ``what``: whose weights, ``otherwise``: what sampling does without ``key``."""
    training = config.training
    given = {
        'train_mode = "unet"': config.network.train_mode == "unet",
        "fp8_base": training.fp8_base,
        "base_model_precision": training.base_model_precision != "no_change",
        "blocks_to_swap": bool(training.blocks_to_swap),
        "fsdp": training.fsdp != "no",
    }
    found = next((option for option, on in given.items() if on), None)
    if found is not None:
        raise ConfigError(
            f"{key} swaps {what} into the transformer for each sampling round, which {found} "
            f"does not allow; remove {key} ({otherwise})"
        )


@contextlib.contextmanager
def swapped_base_weights(denoiser: torch.nn.Module, files: list[Path], table: NameTable):
    """``denoiser`` holding the base weights of ``files`` inside the block (its adapters
    untouched), its own put back after."""
    other: dict[str, torch.Tensor] = {}
    for file in files:
        state = load_file(str(file))
        other.update({name: state[k] for k, name in diffusers_names(list(state), table).items()})
    own = unwrap(denoiser).state_dict(keep_vars=True)
    saved = {}
    with torch.no_grad():
        for name, tensor in own.items():
            plain = name.replace(".base_layer.", ".")
            if plain in other:
                saved[name] = tensor.detach().to("cpu", copy=True)
                tensor.copy_(other.pop(plain).reshape(tensor.shape))
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                own[name].copy_(value)
