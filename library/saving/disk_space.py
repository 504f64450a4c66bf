"""Room for a run's outputs: how much it will write, whether output_dir has it, and where the
trained weights go when output_dir cannot take them after all.

The estimate is of the largest moment, the end of the run: the final weights file (the adapters
for a LoRA; for train_mode "unet" the whole checkpoint, plus the diffusers folder written beside
it when the base model was a folder), its EMA copy, the final state, and the step and epoch saves
still kept then (save_last_n_steps / save_last_n_epochs prune older ones while the run goes).
Earlier moments need no more: a mid-run save is never larger than the final file plus state, and
the oldest save is pruned right after each new one. It is an estimate ("about"): headers and
metadata are allowed for, not measured.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from library.config.schema import SavingSection
from library.networks.adapters import saved_numbers
from library.saving.sizes import format_size
from library.training.memory_estimate import optimizer_state_bytes
from library.training.optimizers import optimizer_kwargs

# safetensors header with kohya's metadata (tag frequencies, bucket info) and small state files
FILE_OVERHEAD = 2**20
RESCUE_FOLDER = "difftune-rescue"


@dataclass(frozen=True)
class SaveSizes:
    """Bytes of one kind of output, as this run writes them."""

    weights: int  # one weights file (also the size of its EMA copy)
    final_folder: int  # the diffusers folder written beside the final checkpoint (0: none)
    state: int  # one state folder
    ema: bool  # every weights file has an EMA copy beside it


@dataclass(frozen=True)
class Estimate:
    """What a run keeps on disk at its largest moment, and what that is made of."""

    bytes: int
    parts: tuple[str, ...]  # e.g. ("final file", "3 step saves", "states")


def _save_itemsize(saving: SavingSection) -> int:
    return {"float": 4, "fp16": 2, "bf16": 2}[saving.save_precision]



def _folder_bytes(folder: Path, skip: str) -> int:
    total = 0
    for entry in folder.iterdir():
        if entry.name == skip:
            continue
        if entry.is_dir():
            total += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        elif entry.is_file():
            total += entry.stat().st_size
    return total


def _numel(module: torch.nn.Module) -> int:
    return sum(t.numel() for t in module.state_dict().values())


def save_sizes(config, parts, ema: bool) -> SaveSizes:
    """The sizes of this run's outputs, from its loaded models (``parts``: TrainedParts)."""
    saving = config.saving
    itemsize = _save_itemsize(saving)
    components = parts.components
    if parts.lora:
        # (alphas are float32 whatever the save precision; one per layer, too few to matter)
        numbers = sum(saved_numbers(model) for model in parts.lora_models().values())
        weights, folder = numbers * itemsize, 0
    else:
        modules = components.family.full_model_modules(components)
        weights = sum(_numel(m) for m in modules) * itemsize
        folder = 0
        if not components.is_single_file:
            base = _folder_bytes(components.model_dir, skip=components.family.denoiser_subfolder)
            folder = base + _numel(components.denoiser) * itemsize + FILE_OVERHEAD
    # the optimizer state saved is the state held in memory: one table serves both estimates
    trained = parts.trained_weights().values()
    state = sum(t.numel() * t.element_size() for t in trained)
    opt = config.optimizer
    state += optimizer_state_bytes(opt.optimizer_type, parts.parameters(), optimizer_kwargs(opt))
    if ema:
        state += 4 * sum(p.numel() for p in parts.parameters())  # the average is kept in float32
    return SaveSizes(weights + FILE_OVERHEAD, folder, state + FILE_OVERHEAD, ema)


def _plural(count: int, what: str) -> str:
    return f"{count} {what}" + ("s" if count != 1 else "")


def _kept_saves(
    saving: SavingSection, total_steps: int, steps_per_epoch: int, epochs: int, start_step: int
) -> list[tuple[str, tuple[int, int]]]:
    """Per cadence ("step", "epoch"): the saves this run makes that are still there at its end,
    as (weights files, states); each kind is pruned by its own save_last_n_* key."""
    out = []
    every = saving.save_every_n_steps
    if every:
        made = max((total_steps - 1) // every - start_step // every, 0)
        keeps = (saving.save_last_n_steps, saving.save_last_n_steps_state)
        # pruning keeps the saves of the last N steps, the newest included
        kept = [min(made, k // every + 1) if k else made for k in _with_fallback(keeps)]
        out.append(("step", tuple(kept)))
    every = saving.save_every_n_epochs
    if every:
        made = max((epochs - 1) // every - (start_step // steps_per_epoch) // every, 0)
        keeps = (saving.save_last_n_epochs, saving.save_last_n_epochs_state)
        out.append(("epoch", tuple(min(made, k) if k else made for k in _with_fallback(keeps))))
    return out


def _with_fallback(keeps: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
    """(weights' save_last_n_*, states' save_last_n_*_state or else the weights' one)."""
    return keeps[0], keeps[1] or keeps[0]


def estimate_run(
    saving: SavingSection,
    sizes: SaveSizes,
    total_steps: int,
    steps_per_epoch: int,
    epochs: int,
    start_step: int = 0,
) -> Estimate:
    """Bytes on disk at the end of a run that starts at ``start_step`` (a resume) and what they
    are. Saves made before ``start_step`` already sit on the disk; they are not counted."""
    weights = sizes.weights * (2 if sizes.ema else 1)
    total = weights + sizes.final_folder
    parts = ["final file" + (" and folder" if sizes.final_folder else "")]
    for unit, kept in _kept_saves(saving, total_steps, steps_per_epoch, epochs, start_step):
        saves, states = kept[0], kept[1] if saving.save_state else 0
        total += saves * weights + states * sizes.state
        if saves:
            parts.append(_plural(saves, f"{unit} save"))
        if states and states != saves:
            parts.append(_plural(states, f"{unit} state"))
    if saving.save_state or saving.save_state_on_train_end:
        total += sizes.state
        parts.append("states")
    if sizes.ema:
        parts.append("EMA copies")
    return Estimate(total, tuple(parts))


def free_bytes(folder: Path) -> int:
    """Bytes an ordinary user may still write in ``folder``'s file system."""
    return shutil.disk_usage(folder).free


def space_problem(folder: Path, estimate: Estimate) -> str | None:
    """The one-line complaint when ``folder`` has less free space than ``estimate``; else None
    (also when the file system cannot say: a write that fails later still says why)."""
    try:
        free = free_bytes(folder)
    except OSError:
        return None
    if free >= estimate.bytes:
        return None
    return (
        f"output_dir {folder} has {format_size(free)} free; this run writes about "
        f"{format_size(estimate.bytes)} ({' + '.join(estimate.parts)}); free space or choose "
        "another output_dir"
    )


def rescue_folders() -> list[Path]:
    """Where the trained weights go when output_dir cannot take them, in the order tried.

    The home folder first: it survives a reboot, where /tmp is often memory that a restarted
    machine (or rented GPU box) loses. The system temp folder next: when home shares the full
    disk with output_dir, /tmp is often another file system. Both are places the user owns.
    """
    folders = []
    with contextlib.suppress(RuntimeError, KeyError):  # no HOME and no passwd entry
        folders.append(Path.home() / RESCUE_FOLDER)
    temp = Path(tempfile.gettempdir()) / RESCUE_FOLDER
    if temp not in folders:
        folders.append(temp)
    return folders


def rescue_name(path: Path, when: float | None = None) -> str:
    """``run.safetensors`` -> ``run-20261201-101500.safetensors``: the original name, stamped so
    that a later rescue never replaces an earlier one."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return f"{path.stem}-{stamp}{path.suffix}"
