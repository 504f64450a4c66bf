"""What every toolbox command shares: kohya's tensor names, output options, reading LoRA files
whose numbers are finite, and writing a result without replacing anything unasked: never over
an input (library/saving/input_clash.py), an existing output only with --overwrite, under the
output name's lock, after clearing what a killed earlier write of it left behind."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from library.errors import CheckpointError, ConfigError
from library.networks.kohya_names import ALPHA, DOWN, UP  # noqa: F401  (a kohya module's tensors)
from library.networks.lycoris.file_math import LOCON_KEYS, LOHA_KEYS, LOKR_KEYS, SHARED_KEYS
from library.saving.atomic import SaveError, atomic_write_file, remove_leftovers
from library.saving.input_clash import OUTPUT_INSIDE, SAME, clash
from library.saving.lora_file import model_hashes, read_safetensors, save_lora_file
from library.saving.output_names import owner_of
from library.saving.run_lock import RunLock

# (option, path) of a command's inputs, e.g. ("--loras", "a.safetensors")
Inputs = Sequence[tuple[str, str | Path | None]]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# The largest strength --ratios takes, either sign: ComfyUI's LoRA loaders take [-100, 100] too.
# Beyond it a LoRA swamps the weights it is added to, and far beyond it they overflow.
RATIO_LIMIT = 100.0


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


def checked_output(path: str | Path, overwrite: bool, inputs: Inputs = ()) -> Path:
    """``path`` as the output of a command: a .safetensors file that touches none of the
    ``inputs`` (even with ``overwrite``), does not exist yet (or ``overwrite``), in a folder
    that exists. ConfigError otherwise, before any work is done."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ConfigError(f"--output {path}: must end in .safetensors")
    refuse_clash("--output", path, inputs)
    if not path.parent.is_dir():
        raise ConfigError(f"--output {path}: folder {path.parent} does not exist; create it first")
    # held from here to the end of the command, so that a second command (or a training run)
    # of the same output name is refused now, not after both have done their work
    hold_output(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"--output {path} exists; choose another name or add --overwrite")
    return path


def refuse_clash(flag: str, output: Path, inputs: Inputs) -> None:
    """ConfigError when writing ``output`` (the value of ``flag``) would touch one of the
    ``inputs``: it is one, lies inside an input folder, or is a folder that holds one. Inputs
    are never replaced, so the fix is another output, whatever --overwrite says (only
    ``metadata --in_place`` replaces its input, and only when asked)."""
    for option, source in inputs:
        if not source:
            continue
        found = clash(output, source, None)
        if found is None:
            continue
        what = "is" if found.relation == SAME else found.relation
        where = "" if found.relation in (SAME, OUTPUT_INSIDE) else f" ({found.output})"
        raise ConfigError(
            f"{flag} {output}{where} {what} {option} {source}; choose another {flag} (inputs "
            "are never replaced)"
        )


# lock file -> the lock of an output name this command holds until release_outputs()
_HELD: dict[Path, RunLock] = {}


def _lock_of(path: Path) -> RunLock:
    """The lock of ``path``'s output name: ``<name>.lock`` beside it, the lock a training run
    of that output_name holds."""
    return RunLock(path.parent, owner_of(path.name))


def hold_output(path: Path, flag: str = "--output") -> None:
    """Take the lock of ``path``'s output name for the rest of the command; ConfigError naming
    ``flag``, ``path`` and the holder if another command or run has it."""
    lock = _lock_of(path)
    if lock.path.absolute() in _HELD:
        return
    try:
        _HELD[lock.path.absolute()] = lock.acquire()
    except ConfigError as exc:
        why = str(exc).replace("another output_name or output_dir", f"another {flag}")
        raise ConfigError(f"{flag} {path}: {why}") from None


def release_outputs() -> None:
    """Release every output lock the command holds (at its end, however it ends)."""
    while _HELD:
        _HELD.popitem()[1].release()


@contextmanager
def writing(path: Path, flag: str = "--output") -> Iterator[None]:
    """Hold the lock of ``path``'s output name while it is written (kept when the command
    already holds it, :func:`hold_output`), after removing the temporary files a killed
    earlier write of ``path`` left; ConfigError naming the holder if another run has it.
    A failed write's SaveError names ``flag``, the option that chose ``path``, in its hint."""
    lock = _lock_of(path)
    held = lock.path.absolute() in _HELD
    if not held:
        lock.acquire()
    try:
        remove_leftovers(path.parent, lambda output: output == path.name)
        yield
    except SaveError as failed:
        named = failed.naming(flag)
        if named is failed:
            raise
        raise named from failed.__cause__
    finally:
        if not held:
            lock.release()


def read_lora(path: str | Path, flag: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a LoRA file a command computes with; CheckpointError naming the
    file and a key when a tensor holds NaN or infinite values."""
    tensors, metadata = read_safetensors(path)
    key = first_non_finite(tensors)
    if key is not None:
        raise CheckpointError(
            f"{flag} {path}: {key} holds NaN or infinite values, so every result made from it "
            "would too (a training that diverged?); use another save of that LoRA"
        )
    return tensors, metadata


def ratios_for(given: Sequence[float] | None, count: int, inputs: str) -> list[float]:
    """One --ratios value per input (1.0 each when none is given), each checked; ``inputs``
    names the inputs in the message ("--loras files")."""
    ratios = list(given) if given is not None else [1.0] * count
    if len(ratios) != count:
        raise ConfigError(
            f"--ratios has {len(ratios)} values for {count} {inputs}; give one per input (or "
            "none for 1.0 each)"
        )
    check_ratios(ratios)
    return ratios


def check_ratios(ratios: Sequence[float]) -> None:
    """ConfigError for a --ratios value that is not finite or beyond +-RATIO_LIMIT."""
    for ratio in ratios:
        if not math.isfinite(ratio) or abs(ratio) > RATIO_LIMIT:
            raise ConfigError(
                f"--ratios {ratio:g}: give a number from -{RATIO_LIMIT:g} to {RATIO_LIMIT:g} "
                "(the range ComfyUI's LoRA loaders take)"
            )


def first_non_finite(
    tensors: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None
) -> str | None:
    """The first key whose tensor is not finite, or would not be once its weights are cast to
    ``dtype`` (alphas are written as float32 whatever the dtype); None when all are."""
    for key, tensor in tensors.items():
        if not tensor.is_floating_point():
            continue
        if dtype is not None:
            tensor = tensor.to(torch.float32 if key.endswith(".alpha") else dtype)
        if not bool(torch.isfinite(tensor).all()):
            return key
    return None


def refuse_non_finite_result(
    tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, cause: str, fix: str | None = None
) -> None:
    """ConfigError naming ``cause`` (what made them so) and ``fix`` when a result's tensors
    are not finite in the saved ``dtype``; called before anything is written. Where fp32
    would hold the result, --save_precision fp32 is named too (alone when ``fix`` is None)."""
    key = first_non_finite(tensors, dtype)
    if key is None:
        return
    label = next((name for name, d in DTYPES.items() if d == dtype), str(dtype))
    fits = dtype != torch.float32 and first_non_finite({key: tensors[key]}, torch.float32) is None
    wider = "--save_precision fp32, which holds it" if fits else None
    if fix is None:
        fix = wider or "the values are too large for any dtype"
    elif wider:
        fix = f"{fix} (or {wider})"
    raise ConfigError(
        f"{cause}: {key} of the result is not finite in {label} (beyond "
        f"+-{torch.finfo(dtype).max:.4g}); {fix}"
    )


def write_file(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None,
    dtype: torch.dtype,
) -> Path:
    """Write atomically under the output's lock (alphas stay float32, kohya's hashes are
    refreshed)."""
    cleaned = None
    if metadata is not None:
        cleaned = {k: v for k, v in metadata.items() if not k.startswith("sshs_")}
    with writing(path):
        return save_lora_file(path, tensors, cleaned, dtype)


def input_dtype(tensors: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The dtype of the file's weights (its first non-alpha float tensor), float32 if none."""
    for key, tensor in tensors.items():
        if not key.endswith(".alpha") and tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


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


# Every tensor name a kohya LoRA or LyCORIS module holds (the end of its keys), longest first.
MODULE_SUFFIXES = tuple(
    sorted((*LOCON_KEYS, *LOHA_KEYS, *LOKR_KEYS, *SHARED_KEYS), key=len, reverse=True)
)


def module_groups(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """module name -> {suffix: tensor} of a LoRA/LyCORIS file. A key is ``<module>.<suffix>``
    with the longest known suffix it ends in (module names with dots, such as
    ``diffusion_model.layers.0.attention.to_q``, stay whole); a key of no known suffix splits
    at its first dot, as kohya's names do."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        suffix = next((s for s in MODULE_SUFFIXES if key.endswith("." + s)), None)
        if suffix is None:
            name, _, suffix = key.partition(".")
        else:
            name = key[: -len(suffix) - 1]
        groups.setdefault(name, {})[suffix] = tensor
    return groups


def module_algorithm(parts: Mapping[str, torch.Tensor]) -> str:
    """The algorithm of one module (a ``module_groups`` value): LoRA (Linear or 1x1 factors),
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
    with writing(path):
        return atomic_write_file(path, lambda tmp: save_file(prepared, str(tmp), metadata=final))


def human_size(size: int) -> str:
    """``1536`` -> ``1.5 KiB``: a file size for messages."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
