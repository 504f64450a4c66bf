"""Where a run's outputs go, when they are due, which old ones are pruned, and what is protected.

Names follow kohya's so users find what they expect: ``name.safetensors`` at the end,
``name-step00000500.safetensors`` every N steps, ``name-000003.safetensors`` every N epochs, and a
``-state`` folder beside each when states are saved. ``name-summary.json`` describes the latest
run of the name (library/training/run_summary.py); it is a record, not an output: it never stops
a run, and every run that takes the name replaces it. Which names a run owns, and why no two
accepted output names share one, is in library/saving/output_names.py.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from library.config.schema import SavingSection
from library.errors import ConfigError
from library.sampling.grid import SAMPLE_SUBDIR, is_sample_image, sample_dir
from library.saving import atomic
from library.saving.output_names import EPOCH as _EPOCH
from library.saving.output_names import EXPERT_TAGS, LOCK_SUFFIX, SUMMARY_SUFFIX, is_output
from library.saving.output_names import STEP as _STEP

RUN_ID_KEY = "ss_session_id"  # kohya's per-run random id; ours stays the same across resumes
# ``<name>-replaced-2026-12-07_101500``: where --overwrite moves an earlier run's files. The time
# has no "-" before its six digits, so the folder is no output of any name (output_names.EPOCH).
REPLACED = "-replaced-"
_REPLACED_TIME = "%Y-%m-%d_%H%M%S"


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

    @property
    def summary(self) -> Path:
        """The run summary: not one of existing_outputs(), so it is never refused or pruned."""
        return self.dir / f"{self.name}{SUMMARY_SUFFIX}"

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
        return [path for path in sorted(self.dir.iterdir()) if self._owns(path.name)]

    def latest_state(self, before: Path | None = None) -> Path | None:
        """The state folder of this output_name with the highest step (epoch states count by
        their progress.json step), other than ``before``; None when there is none."""
        found = []
        for path in self.existing_outputs():
            if path.is_dir() and path.name.endswith("-state") and path != before:
                found.append((_state_step(path), path.name, path))
        return max(found)[2] if found else None

    def refuse_overwrite(self, resuming: bool, run_id: str | None = None) -> None:
        """Stop before training if this run would replace outputs of another run.

        A resume may replace only the outputs of the run it continues (``run_id``, recorded in
        every state and file it wrote); a resume from a state without a run id (saved by an
        older difftune) is trusted, as before.
        """
        if self.saving.overwrite:
            return
        existing = self.existing_outputs()
        if resuming:
            if run_id is None:
                return
            foreign = [p for p in existing if output_run_id(p) != run_id]
            if foreign:
                more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
                raise ConfigError(
                    f"{foreign[0]}{more} was not written by the run being resumed; move it away, "
                    "choose another output_name, or set overwrite = true to replace it"
                )
            return
        if existing:
            more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
            state = self.latest_state()
            go_on = f"continue that run with --resume {state}, " if state else ""
            raise ConfigError(
                f"{existing[0]}{more} already exists: {go_on}replace it with --overwrite, or "
                "choose another --output_name"
            )

    def earlier_run(self) -> tuple[list[Path], list[Path]]:
        """What --overwrite moves aside: (this name's outputs and summary in output_dir, its
        sample images and grids in output_dir/sample)."""
        outputs = self.existing_outputs()
        if self.summary.is_file():
            outputs.append(self.summary)
        samples = sample_dir(self.dir)
        found = sorted(samples.iterdir()) if samples.is_dir() else []
        return outputs, [path for path in found if is_sample_image(self.name, path.name)]

    def set_aside(self, when: float | None = None) -> Path | None:
        """With --overwrite: move the earlier run's files of this name (earlier_run) into a new
        folder ``<name>-replaced-<date>_<time>`` in output_dir (samples into its ``sample``), so
        that none of them stays among this run's saves and samples; the folder, or None when
        there was nothing. Call only while holding the run lock."""
        outputs, samples = self.earlier_run()
        if not outputs and not samples:
            return None
        stamp = time.strftime(_REPLACED_TIME, time.localtime(when))
        folder = self.dir / f"{self.name}{REPLACED}{stamp}"
        count = 1
        while folder.exists():
            count += 1
            folder = self.dir / f"{self.name}{REPLACED}{stamp}_{count}"
        (folder / SAMPLE_SUBDIR if samples else folder).mkdir(parents=True)
        for path in outputs:
            shutil.move(path, folder / path.name)
        for path in samples:
            shutil.move(path, folder / SAMPLE_SUBDIR / path.name)
        return folder

    def remove_leftovers(self) -> list[Path]:
        """Delete the temporary files and folders an interrupted save of this output_name left
        (atomic writes make ``.<output>.<random>.tmp`` and ``.old`` beside each output). Call
        only while holding the run lock, so no other run of this name is writing them."""
        return atomic.remove_leftovers(
            self.dir, lambda output: self._owns(output) or output == self.summary.name
        )

    def writes(self, entry: str) -> bool:
        """Whether a run of this output_name may create, replace or delete ``entry`` in
        output_dir: its outputs, its summary, its lock and the temporaries of its saves."""
        output = atomic.temporary_of(entry)
        if output is not None:
            return self._owns(output) or output == self.summary.name
        return self._owns(entry) or entry in (self.summary.name, f"{self.name}{LOCK_SUFFIX}")

    def _owns(self, file_name: str) -> bool:
        """Whether ``file_name`` is one of this output_name's outputs."""
        return is_output(self.name, file_name)

    def describe(self, path: Path) -> dict:
        """What an output of this name is: {"kind", "path"} and, where its name or its state
        says so, "step" or "epoch"; "final" for the end-of-run outputs."""
        rest = path.name[len(self.name) :]
        kinds = {".safetensors": "weights", "-ema.safetensors": "ema weights", "-state": "state"}
        entry: dict = {"path": str(path.absolute())}
        for tag in EXPERT_TAGS:  # an expert's weights: the kind of the name without its tag
            if tag in rest:
                rest = rest.replace(tag, "", 1)
                entry["expert"] = tag[1:]
        numbered = _STEP.fullmatch(rest) or _EPOCH.fullmatch(rest)
        if numbered:
            entry["kind"] = kinds.get(numbered.group(2), "diffusers folder")
            entry["step" if numbered.re is _STEP else "epoch"] = int(numbered.group(1))
        else:
            entry["kind"] = kinds.get(rest, "diffusers folder")
            entry["final"] = True
        if entry["kind"] == "state":
            step = _state_step(path)
            entry["step"] = step if step >= 0 else None
        return entry

    def _numbered(self, pattern: re.Pattern) -> list[tuple[int, Path]]:
        out = []
        for path in self.existing_outputs():
            match = pattern.fullmatch(path.name[len(self.name) :])
            if match:
                out.append((int(match.group(1)), path))
        return out

    def prune_steps(
        self, step: int, states: bool = False, protect: Path | None = None
    ) -> list[Path]:
        """Remove the step saves older than save_last_n_steps steps; when ``states`` (this save
        wrote a state, so a newer one exists), also the step states older than
        save_last_n_steps_state steps (unset: save_last_n_steps), as sd-scripts does. ``protect``
        (the state a resume started from) is never removed."""
        saving = self.saving
        keep = (saving.save_last_n_steps, saving.save_last_n_steps_state or saving.save_last_n_steps)
        doomed = [
            path
            for n, path in self._numbered(_STEP)
            if self._prunable(path, keep, states, protect) and n < step - self._keep(path, keep)
        ]
        return _remove(doomed)

    def prune_epochs(
        self, epoch: int, states: bool = False, protect: Path | None = None
    ) -> list[Path]:
        """Keep only the last save_last_n_epochs epoch saves and, when ``states`` (this save
        wrote a state), the last save_last_n_epochs_state epoch states (unset:
        save_last_n_epochs). ``protect`` is never removed."""
        saving, every = self.saving, self.saving.save_every_n_epochs or 1
        keep = (
            saving.save_last_n_epochs,
            saving.save_last_n_epochs_state or saving.save_last_n_epochs,
        )
        doomed = [
            path
            for n, path in self._numbered(_EPOCH)
            if self._prunable(path, keep, states, protect)
            and n <= epoch - self._keep(path, keep) * every
        ]
        return _remove(doomed)

    @staticmethod
    def _keep(path: Path, keep: tuple[int | None, int | None]) -> int:
        return keep[1] if path.name.endswith("-state") else keep[0]

    def _prunable(
        self, path: Path, keep: tuple[int | None, int | None], states: bool, protect: Path | None
    ) -> bool:
        if path == protect or (path.name.endswith("-state") and not states):
            return False
        return bool(self._keep(path, keep))


def output_run_id(path: Path) -> str | None:
    """The run id recorded in an output: ss_session_id of a weights file, run_id of a state,
    and for a diffusers folder that of the weights file written with it."""
    if path.is_dir() and path.name.endswith("-state"):
        try:
            return json.loads((path / "progress.json").read_text(encoding="utf-8")).get("run_id")
        except (OSError, ValueError, AttributeError):
            return None
    if path.is_dir():
        sibling = path.with_name(path.name + ".safetensors")
        return output_run_id(sibling) if sibling.is_file() else None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as file:
            return (file.metadata() or {}).get(RUN_ID_KEY)
    except Exception:  # not a readable safetensors file: not ours to replace
        return None


def _state_step(folder: Path) -> int:
    try:
        return int(json.loads((folder / "progress.json").read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1  # unreadable: never preferred over a readable state


def _remove(paths: list[Path]) -> list[Path]:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return paths
