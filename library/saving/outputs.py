"""Where a run's outputs go, when they are due, which old ones are pruned, and what is protected.

Names follow kohya's so users find what they expect: ``name.safetensors`` at the end,
``name-step00000500.safetensors`` every N steps, ``name-000003.safetensors`` every N epochs, and a
``-state`` folder beside each when states are saved.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from library.config.schema import SavingSection
from library.errors import ConfigError

_STEP = re.compile(r"-step(\d{8})(-state|-ema\.safetensors|\.safetensors)?$")
_EPOCH = re.compile(r"-(\d{6})(-state|-ema\.safetensors|\.safetensors)?$")


class OutputLayout:
    """Names and cadence of the outputs of one run."""

    def __init__(self, saving: SavingSection):
        self.saving = saving
        self.dir = Path(saving.output_dir)
        self.name = saving.output_name

    @property
    def final(self) -> Path:
        return self.dir / f"{self.name}.safetensors"

    @property
    def final_state(self) -> Path:
        return self.dir / f"{self.name}-state"

    def step_file(self, step: int) -> Path:
        return self.dir / f"{self.name}-step{step:08d}.safetensors"

    def epoch_file(self, epoch: int) -> Path:
        return self.dir / f"{self.name}-{epoch:06d}.safetensors"

    @staticmethod
    def ema_of(weights: Path) -> Path:
        """The EMA weights file saved beside a weights file."""
        return weights.with_name(weights.name.removesuffix(".safetensors") + "-ema.safetensors")

    @staticmethod
    def state_of(weights: Path) -> Path:
        """The state folder saved beside a weights file."""
        return weights.with_name(weights.name.removesuffix(".safetensors") + "-state")

    def step_due(self, step: int, total: int) -> bool:
        every = self.saving.save_every_n_steps
        return bool(every) and step % every == 0 and step < total

    def epoch_due(self, epoch: int, total_epochs: int) -> bool:
        every = self.saving.save_every_n_epochs
        return bool(every) and epoch % every == 0 and epoch < total_epochs

    def existing_outputs(self) -> list[Path]:
        """Files and folders of this output_name already in output_dir."""
        if not self.dir.is_dir():
            return []
        found = []
        for path in sorted(self.dir.iterdir()):
            stem = path.name
            if not stem.startswith(self.name):
                continue
            rest = stem[len(self.name) :]
            if rest in (".safetensors", "-ema.safetensors", "-state", "") or _STEP.fullmatch(rest) or _EPOCH.fullmatch(rest):
                found.append(path)
        return found

    def refuse_overwrite(self, resuming: bool) -> None:
        """Stop before training if this run would replace outputs of an earlier one."""
        if resuming or self.saving.overwrite:
            return
        existing = self.existing_outputs()
        if existing:
            more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
            raise ConfigError(
                f"{existing[0]}{more} already exists; choose another output_name or output_dir, "
                "remove it, set overwrite = true, or set resume to continue that run"
            )

    def _numbered(self, pattern: re.Pattern) -> list[tuple[int, Path]]:
        out = []
        for path in self.existing_outputs():
            match = pattern.fullmatch(path.name[len(self.name) :])
            if match:
                out.append((int(match.group(1)), path))
        return out

    def prune_steps(self, step: int) -> list[Path]:
        """Remove step saves older than save_last_n_steps steps (kohya's meaning)."""
        keep = self.saving.save_last_n_steps
        if not keep:
            return []
        doomed = [p for n, p in self._numbered(_STEP) if n < step - keep]
        return _remove(doomed)

    def prune_epochs(self, epoch: int) -> list[Path]:
        """Keep only the last save_last_n_epochs epoch saves."""
        keep, every = self.saving.save_last_n_epochs, self.saving.save_every_n_epochs or 1
        if not keep:
            return []
        doomed = [p for n, p in self._numbered(_EPOCH) if n <= epoch - keep * every]
        return _remove(doomed)


def _remove(paths: list[Path]) -> list[Path]:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return paths
