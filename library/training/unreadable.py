"""Images that cannot be read any more while the run trains, and what the run does about them.

The scan checked every image before training, but a file can still be deleted, truncated or
overwritten while the run goes on (a sync tool, a second copy being written, a failing disk). The
loaders then give a stand-in sample with loss weight 0 and the problem (library.data.samples), so
every process still runs every micro-batch, and a process whose image broke never leaves the
others waiting at a collective. At the end of each optimizer step the processes agree, in the
step's one collective (library.training.stops), on whether any of them met such a sample; only
then do they exchange the problems themselves. Then:

- with skip_bad_images the step is applied (its stand-ins added nothing to it, as padding slots
  add nothing) and each problem is named once, in a warning;
- otherwise the step is not applied. As for a stop by SIGTERM, the state of the last whole step
  is saved and the run stops with one line naming the image and the ``--resume`` that continues
  it (exit code 1: training started and could not finish). A first step has nothing to save: it
  stops as bad input (exit code 2), like a bad image found by the scan.

Validation images are handled the same way after each validation (validation_runs): an unreadable
one is left out of the loss, and the run stops or warns as above.
"""

from __future__ import annotations

from pathlib import Path

from accelerate.utils import gather_object

from library.errors import DataError, TrainingError

SKIP_HINT = "skip_bad_images = true leaves unreadable images out and trains on"


class UnreadableImages:
    """The problems this process met since the last agreement, and those already named."""

    def __init__(self, accelerator, skip: bool) -> None:
        self.accelerator = accelerator
        self.skip = skip
        self.pending: list[str] = []
        self._named: set[str] = set()

    def note(self, batch: dict) -> None:
        """Remember the problems of a batch's unreadable samples (see TrainData.loader)."""
        self.pending.extend(batch.get("unreadable", ()))

    def agree(self) -> list[str]:
        """The problems every process met since the last agreement, each once, in process
        order. A collective: call it on every process once any process has some."""
        mine, self.pending = self.pending, []
        every = gather_object(mine) if self.accelerator.num_processes > 1 else mine
        return list(dict.fromkeys(every))

    def new(self, problems: list[str]) -> list[str]:
        """The problems not named before (an image stays unreadable: it is named once)."""
        fresh = [p for p in problems if p not in self._named]
        self._named.update(fresh)
        return fresh


def left_out_line(problem: str, since: str) -> str:
    """The warning for an image left out under skip_bad_images (``since``: "from optimizer
    step 12 on", "of the validation loss from step 12 on")."""
    return f"left out {since} (skip_bad_images): {problem}"


def stop_error(
    problems: list[str], global_step: int, state: Path | None
) -> DataError | TrainingError:
    """The error that ends a run after ``global_step`` whole optimizer steps because of
    ``problems``; ``state`` is the state saved at that step (None when no step was trained)."""
    first = problems[0].rstrip(".")
    more = f" (and {len(problems) - 1} more, named above)" if len(problems) > 1 else ""
    if state is None:
        return DataError(f"{first}{more}; no optimizer step was trained ({SKIP_HINT})")
    return TrainingError(
        f"{first}{more}. The run stopped after optimizer step {global_step} with its state saved; "
        f"once the file is fixed, continue with --resume {state} ({SKIP_HINT})"
    )
