"""What every toolbox command shares: kohya's tensor names, output options, and writing a result without replacing anything unasked (files are read with
library.saving.lora_file.read_safetensors)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import torch

from library.errors import ConfigError
from library.networks.kohya_keys import ALPHA, DOWN, UP  # noqa: F401  (a kohya module's tensors)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def add_output_arguments(parser: argparse.ArgumentParser, what: str = "LoRA file") -> None:
    """--output, --overwrite and --save_precision, shared by the commands that write a file."""
    parser.add_argument("--output", required=True, help=f"the {what} to write (.safetensors)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace --output if it exists (default: refuse)"
    )
    parser.add_argument(
        "--save_precision",
        choices=sorted(DTYPES),
        default=None,
        help="dtype of the written weights (default: that of the input)",
    )


def checked_output(path: str | Path, overwrite: bool) -> Path:
    """``path`` as the output of a command: a .safetensors file that does not exist yet (or
    ``overwrite``), in a folder that exists. ConfigError otherwise, before any work is done."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ConfigError(f"--output {path}: must end in .safetensors")
    if path.exists() and not overwrite:
        raise ConfigError(f"--output {path} exists; choose another name or add --overwrite")
    if not path.parent.is_dir():
        raise ConfigError(f"--output {path}: folder {path.parent} does not exist; create it first")
    return path


def write_file(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None,
    dtype: torch.dtype,
) -> Path:
    """Write atomically (alphas stay float32, kohya's hashes are refreshed)."""
    from library.saving.lora_file import save_lora_file

    cleaned = None
    if metadata is not None:
        cleaned = {k: v for k, v in metadata.items() if not k.startswith("sshs_")}
    return save_lora_file(path, tensors, cleaned, dtype)


def input_dtype(tensors: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The dtype of the file's weights (its first non-alpha float tensor), float32 if none."""
    for key, tensor in tensors.items():
        if not key.endswith(".alpha") and tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def refuse_input_as_output(output: Path, inputs: list[str | Path]) -> None:
    """ConfigError if ``output`` is one of the ``inputs`` (even with --overwrite): a command
    writes a new file; only ``metadata --in_place`` replaces its input, and only when asked."""
    for source in inputs:
        source = Path(source)
        same = (
            output.samefile(source)
            if output.exists() and source.exists()
            else output.resolve() == source.resolve()
        )
        if same:
            raise ConfigError(
                f"--output {output} is the input file; choose another name (inputs are never "
                "replaced)"
            )


def checked_device(name: str) -> torch.device:
    """``--device`` as a torch device; ConfigError for a bad name or a GPU that is not there."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"--device {name}: not a device name (cpu, cuda, cuda:1, ...)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA GPU is available here; use --device cpu")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and device.index is not None and device.index >= count:
        raise ConfigError(f"--device {name}: there are only {count} CUDA devices")
    return device


# Tensor suffixes that mark a module's algorithm, checked in this order (LyCORIS' key names).
_ALGORITHM_MARKERS = (
    ("hada_", "LoHa"),
    ("lokr_", "LoKr"),
    ("lora_mid.", "LoCon (Tucker)"),
    ("oft_", "OFT"),
    ("a1.", "GLoRA"),
    ("on_input", "IA3"),
    ("w_norm", "norm"),
    ("diff", "full"),
)
# Algorithms whose modules are plain kohya factor pairs (lora_down / lora_up / alpha).
KOHYA_LORA = ("LoRA", "LoCon")


def module_algorithm(parts: Mapping[str, torch.Tensor]) -> str:
    """The algorithm of one module (``group_modules`` value): LoRA (Linear or 1x1 factors),
    LoCon (a kh x kw kernel in lora_down), a LyCORIS one (LoHa, LoKr, ...), with ``+DoRA`` when
    it carries a dora_scale (plain ``DoRA`` for a DoRA LoRA), or ``unknown``."""
    dora = "dora_scale" in parts
    for marker, name in _ALGORITHM_MARKERS:
        if any(suffix.startswith(marker) for suffix in parts):
            return f"{name}+DoRA" if dora else name
    down = parts.get("lora_down.weight")
    if down is None:
        return "unknown"
    if dora:
        return "DoRA"
    return "LoCon" if down.ndim == 4 and tuple(down.shape[2:]) != (1, 1) else "LoRA"


def write_file_unchanged(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str],
    dtype: torch.dtype | None = None,
    hashes: bool = True,
) -> Path:
    """Write ``tensors`` exactly as they are (dtypes and bits, alphas included), or with their
    weights cast to ``dtype`` (alphas stay as they are), with ``metadata``, atomically; kohya's
    hashes are recomputed for the new header when ``hashes``, else left out."""
    from safetensors.torch import save_file

    from library.saving.atomic import atomic_write_file
    from library.saving.lora_file import model_hashes

    prepared = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point() and not key.endswith(".alpha"):
            tensor = tensor.to(dtype)
        prepared[key] = tensor.contiguous()
    header = {k: v for k, v in metadata.items() if not k.startswith("sshs_")}
    if hashes:
        header.update(model_hashes(prepared, header))
    final = header or None
    return atomic_write_file(path, lambda tmp: save_file(prepared, str(tmp), metadata=final))


def human_size(size: int) -> str:
    """``1536`` -> ``1.5 KiB``: a file size for messages."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
