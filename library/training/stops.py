"""Safe stops: SIGINT/SIGTERM end a run at the next optimizer step with its state saved.

A signal only sets a flag; the loop acts on it at the next optimizer-step boundary, after every
process has agreed (the flag travels with the step's loss in one collective), so all processes
save the same state and leave together. A second Ctrl-C while waiting stops at once.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

import torch

from library.errors import DifftuneError

_HANDLED = (signal.SIGINT, signal.SIGTERM)


class TrainingStopped(DifftuneError):
    """The run was stopped by a signal after saving a state to resume from."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum  # the shell's convention for "ended by signal N"


class StopSignals:
    """Context manager that turns SIGINT/SIGTERM into a flag read at step boundaries."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.signum:  # asked twice: the user does not want to wait for the step to end
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopSignals:
        try:
            for sig in _HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread (e.g. inside a notebook worker): no handlers
            self._previous.clear()
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True)
class StepSummary:
    """What all processes agree on at an optimizer-step boundary."""

    loss: float  # mean over the step's micro-batches and processes
    signum: int  # a stop signal seen by any process, else 0
    unreadable: int = 0  # samples of the step that no process could read (training.unreadable)


def agree_on_step(
    accelerator, loss_sum: torch.Tensor, accumulation: int, signum: int, unreadable: int = 0
) -> StepSummary:
    """One collective carries the summed loss, the stop flag and the count of unreadable
    samples of every process."""
    flags = torch.tensor([float(signum), float(unreadable)], device=loss_sum.device)
    local = torch.cat([loss_sum.detach().float().reshape(1), flags])
    gathered = accelerator.gather(local.unsqueeze(0))  # [processes, 3]
    loss = gathered[:, 0].mean().item() / accumulation
    signals = [int(s) for s in gathered[:, 1].tolist() if s]
    return StepSummary(
        loss=loss, signum=signals[0] if signals else 0, unreadable=int(gathered[:, 2].sum().item())
    )
