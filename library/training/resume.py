"""Resuming a run from a saved state (``--resume``): the state is checked against this run and
loaded into it."""

from __future__ import annotations

import torch

from library.config.schema import Config
from library.errors import CheckpointError
from library.training.preflight import RunStart
from library.training.saver import Saver
from library.training.schedulers import restore_schedule
from library.training.setup import TrainedParts
from library.training.sharding import optimizer_params, shard_like, sharded_optimizer_state
from library.training.state import load_state


def resume_run(
    config: Config, parts: TrainedParts, optimizer, scheduler, saver: Saver, start: RunStart,
    accelerator,
) -> int:  # fmt: skip
    """Load ``config.saving.resume``'s state into this run (trained weights, this process's
    slice of them when sharded, optimizer, schedule, loss scaler, EMA, the record of changed
    settings) and return its optimizer step; 0 when the run does not resume. A state that does
    not fit this run raises CheckpointError naming what differs."""
    path = config.saving.resume
    if not path:
        return 0
    state = load_state(path)
    weights = parts.trained_weights()
    missing = sorted(set(weights) - set(state.weights))
    if missing:
        raise CheckpointError(f"resume: {path} has no weights for {missing[0]} ({len(missing)} missing); it was saved by another kind of run")
    for key, param in weights.items():
        if state.weights[key].shape != param.shape:
            raise CheckpointError(
                f"resume: {path} holds {key} with shape {list(state.weights[key].shape)}, this run's is "
                f"{list(param.shape)}; it was saved with another network_dim, conv_dim or model"
            )
    with torch.no_grad():
        for key, param in weights.items():
            param.copy_(shard_like(state.weights[key], param))  # this process's slice
    try:
        optimizer.load_state_dict(sharded_optimizer_state(state.optimizer, optimizer_params(optimizer)))
    except ValueError as exc:  # e.g. other parameter groups (LoRA+ or text encoder on/off)
        raise CheckpointError(f"resume: {path} has optimizer state for other parameter groups ({exc})") from exc
    restore_schedule(scheduler, state.scheduler)  # at the saved step, with this run's rates
    saver.resume_changes = list(state.progress.resume_changes)
    if start.resume is not None and start.resume.changes:
        changed = {k: list(v) for k, v in start.resume.changes.items() if k != "datasets"}
        saver.resume_changes.append({"step": state.progress.global_step, "changes": changed})
    if state.scaler is not None and accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(state.scaler)
    if saver.ema is not None:
        if state.ema is None:
            raise CheckpointError(f"resume: {path} has no EMA weights; it was saved without ema_decay")
        saver.ema.load_state_dict(state.ema)
    accelerator.print(f"resumed from {path} at optimizer step {state.progress.global_step}")
    return state.progress.global_step
