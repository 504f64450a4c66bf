"""Saving on cadence: weights and states, written by the main process, met by all at a
collective that tells every process whether the write worked. Weights that output_dir cannot take
are written to a rescue folder instead, and the error names it."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from library.config.schema import Config
from library.data.content_hash import all_finite
from library.errors import ConfigError, DifftuneError, TrainingError
from library.saving.atomic import NO_SPACE, SaveError
from library.saving.disk_space import (
    estimate_run,
    rescue_folders,
    rescue_name,
    save_sizes,
    space_problem,
)
from library.saving.metadata import RunInfo, lora_metadata, unet_metadata
from library.saving.output_names import expert_file
from library.saving.outputs import OutputLayout, output_run_id
from library.saving.writers import SAVE_DTYPES, write_checkpoint, write_lora, write_pipeline_folder
from library.training.ema import WeightAverage
from library.training.experts import expert_metadata, expert_ranges
from library.training.from_main import from_main
from library.training.optimizers import optimizer_eval_mode, optimizer_train_mode
from library.training.plan import RunPlan
from library.training.resume_rules import write_settings
from library.training.setup import TrainedParts
from library.training.sharding import full_optimizer_state, gathered_weights, local_part, shards
from library.training.state import Progress, save_state


class Saver:
    """Writes the run's outputs; every method is called on every process."""

    def __init__(self, config: Config, accelerator, parts: TrainedParts, plan: RunPlan, data_stats, run_id: str):
        self.config, self.accelerator, self.parts, self.plan = config, accelerator, parts, plan
        self.layout = OutputLayout(config.saving)
        self.data_stats = data_stats
        self.run_id = run_id  # recorded in every file and state, so a resume knows its own outputs
        self.resume_changes: list = []  # what resumes changed, oldest first (see resume_rules)
        self.started_at = time.time()
        self.optimizer = self.scheduler = self.ema = None
        self.sharded = shards(config, accelerator)  # FSDP: saves gather the trained weights
        # the state this run resumed from: never pruned until the run has written a newer one
        self.resumed_from = Path(config.saving.resume) if config.saving.resume else None

    def attach(self, optimizer, scheduler, ema: WeightAverage | None) -> None:
        self.optimizer, self.scheduler, self.ema = optimizer, scheduler, ema

    def progress(self, global_step: int) -> Progress:
        return Progress(
            global_step=global_step,
            seed=self.config.training.seed,
            train_mode=self.config.network.train_mode,
            steps_per_epoch=self.plan.steps_per_epoch,
            effective_batch_sizes=list(self.plan.effective_batch_sizes),
            world_size=self.plan.world_size,
            run_id=self.run_id,
            resume_changes=self.resume_changes,
        )

    def after_step(self, global_step: int) -> None:
        if self.layout.step_due(global_step, self.plan.total_steps):
            path = self.layout.step_file(global_step)
            state = self.config.saving.save_state
            self._save(path, global_step, with_state=state)
            if self.accelerator.is_main_process:
                self.layout.prune_steps(global_step, states=state, protect=self.resumed_from)

    def after_epoch(self, epoch: int, global_step: int) -> None:
        """``epoch`` is 1-based: the number of epochs completed."""
        if self.layout.epoch_due(epoch, self.plan.epochs) and global_step < self.plan.total_steps:
            path = self.layout.epoch_file(epoch)
            state = self.config.saving.save_state
            self._save(path, global_step, with_state=state)
            if self.accelerator.is_main_process:
                self.layout.prune_epochs(epoch, states=state, protect=self.resumed_from)

    def at_end(self, global_step: int) -> Path:
        saving = self.config.saving
        self._save(self.layout.final, global_step, with_state=False, final=True)
        if saving.save_state or saving.save_state_on_train_end:
            self.save_state(self.layout.final_state, global_step)
        if self.parts.experts:  # the first expert's file; every expert's is beside it
            return expert_file(self.layout.final, next(iter(self.parts.experts)))
        return self.layout.final

    def check_finite(self, global_step: int, what: Path) -> None:
        """Refuse to write ``what`` when a trained weight is NaN or infinite: such a file or state
        would look good and hold nothing. Called on every process (the weights are the same,
        or, sharded, each process checks its slices and all learn what any found)."""
        weights = self.parts.trained_weights().items()
        broken = [k for k, t in weights if not all_finite(local_part(t).detach())]
        if self.sharded:
            found: list = [None] * self.accelerator.num_processes
            torch.distributed.all_gather_object(found, broken)
            broken = sorted({k for keys in found for k in keys})
        if not broken:
            return
        last = self.layout.latest_state(before=what)
        where = f"the last good state is {last}" if last else "no earlier state was saved"
        more = f" and {len(broken) - 1} more" if len(broken) > 1 else ""
        raise TrainingError(
            f"the trained weights are not finite at optimizer step {global_step} ({broken[0]}"
            f"{more}), so {what} was not written; {where}. Lower learning_rate "
            '(or use mixed_precision = "bf16" instead of fp16) and start again'
        )

    def check_free_space(self, start_step: int) -> None:
        """Before the first step: ConfigError on every process when output_dir has less free
        space than the run will write (see disk_space). ``start_step``: the step resumed at."""
        problem = None
        if self.accelerator.is_main_process:
            plan = self.plan
            sizes = save_sizes(self.config, self.parts, ema=self.ema is not None)
            estimate = estimate_run(
                self.config.saving, sizes, plan.total_steps, plan.steps_per_epoch, plan.epochs,
                start_step,
            )
            problem = space_problem(self.layout.dir, estimate)
        problem = from_main(self.accelerator, problem)
        if problem is not None:
            raise ConfigError(problem)

    def stop_state(self, global_step: int) -> Path:
        """The state a stop at ``global_step`` names: one this run already has at that step
        (saved on its cadence, or the state it resumed from, which is never written over), else
        one saved now. Called on every process."""
        state = self.layout.dir / f"{self.layout.name}-step{global_step:08d}-state"
        resumed = self.config.saving.resume
        own = state.is_dir() and (
            output_run_id(state) == self.run_id
            or (resumed is not None and Path(resumed).is_dir() and state.samefile(resumed))
        )
        if not own:
            self.save_state(state, global_step)
        return state

    def save_state(self, path: Path, global_step: int) -> None:
        self.check_finite(global_step, path)
        with self._gathered():
            optimizer_state = (
                full_optimizer_state(self.optimizer, self.accelerator.is_main_process)
                if self.sharded
                else self.optimizer.state_dict()
            )
            self._on_main(lambda: self._write_state(path, global_step, optimizer_state), path)

    def _write_state(self, path: Path, global_step: int, optimizer_state: dict) -> None:
        try:
            save_state(
                path,
                self.parts.trained_weights(),
                optimizer_state,
                self.scheduler,
                self.accelerator.scaler,
                self.progress(global_step),
                ema=self.ema.state_dict() if self.ema else None,
                extra=lambda tmp: write_settings(tmp, self.config),
            )
            self.resumed_from = None  # a newer state exists now: pruning may reach that one
        except SaveError as failed:
            last = self.layout.latest_state(before=path)
            message = f"{_what_failed(failed)}; {_resume_hint(last, failed)}" if last else (
                f"{failed}; no earlier state was saved"
            )
            raise SaveError(message, failed.path, failed.reason) from failed

    def _gathered(self) -> AbstractContextManager:
        """Sharded: the main process's modules (and EMA) hold whole trained weights while
        inside; every process enters. Otherwise nothing changes."""
        if not self.sharded:
            return nullcontext()
        modules = [module for _, module in self.parts.trained_modules()]
        return gathered_weights(modules, self.ema, self.accelerator.is_main_process)

    def _save(self, path: Path, global_step: int, with_state: bool, final: bool = False) -> None:
        self.check_finite(global_step, path)
        # schedule-free optimizers hold the weights to save only while in eval mode
        optimizer_eval_mode(self.optimizer)
        try:
            with self._gathered():
                self._on_main(lambda: self._write_or_rescue(path, global_step, final), path)
        finally:
            optimizer_train_mode(self.optimizer)
        if with_state:
            self.save_state(self.layout.state_of(path), global_step)

    def _on_main(self, write: Callable[[], None], path: Path) -> None:
        """Run ``write`` on the main process, then tell every process whether it worked.

        This is the saves' meeting point. A plain barrier would leave the other processes
        waiting there, until the DDP timeout, for a main process that raised and left; here they
        raise a SaveError with its message and leave with it (only the main process prints).
        """
        error: Exception | None = None
        failure: str | None = None
        if self.accelerator.is_main_process:
            try:
                write()
            except Exception as exc:
                error = exc
                failure = str(exc) if isinstance(exc, DifftuneError) else (
                    f"the main process failed while writing {path} ({type(exc).__name__})"
                )
        failure = from_main(self.accelerator, failure)
        if error is not None:
            raise error
        if failure is not None:
            raise SaveError(failure)

    def _write_or_rescue(self, path: Path, global_step: int, final: bool) -> None:
        try:
            self._write_weights(path, global_step, final)
        except SaveError as failed:
            raise self._rescue(path, global_step, final, failed) from failed

    def _rescue(self, path: Path, global_step: int, final: bool, failed: SaveError) -> SaveError:
        """Write the weights that ``path`` should have held into a rescue folder (see
        disk_space.rescue_folders) and return the error that names where they went; when no
        folder takes them, the error names the last state instead."""
        name = rescue_name(path)
        folders = rescue_folders()
        what = _what_failed(failed)
        for folder in folders:
            target = folder / name
            try:
                # weights only: the diffusers folder is a convenience copy of the same UNet
                self._write_weights(target, global_step, final, with_folder=False)
            except SaveError:
                continue
            message = f"{what}; the trained weights were saved to {target} instead"
            return SaveError(message, failed.path, failed.reason)
        tried = " or ".join(str(folder) for folder in folders)
        last = self.layout.latest_state()
        keep = _resume_hint(last, failed) if last else "no state was saved: the weights are lost"
        message = f"{what}; writing them to {tried} failed too; {keep}"
        return SaveError(message, failed.path, failed.reason)

    def _write_weights(
        self, path: Path, global_step: int, final: bool, with_folder: bool = True
    ) -> None:
        metadata = self._metadata(global_step, final)
        self._write_model(path, metadata, folder=final and with_folder)
        if self.ema is not None:
            with self.ema.swapped_in():
                ema_metadata = {**metadata, "ss_ema_decay": str(self.ema.decay)}
                self._write_model(self.layout.ema_of(path), ema_metadata, folder=False)

    def _write_model(self, path: Path, metadata: dict[str, str], folder: bool) -> None:
        """The trained weights as they are now: a LoRA file, or an original-layout checkpoint
        (and, at the end, a diffusers folder when the base model was one)."""
        dtype = SAVE_DTYPES[self.config.saving.save_precision]
        if self.parts.experts:
            self._write_experts(path, metadata, dtype)
            return
        if self.parts.lora:
            family = self.parts.components.family
            layout = self.config.saving.lora_format
            write_lora(path, self.parts.lora_models(), metadata, dtype, family, layout)
            return
        components = self.parts.components
        write_checkpoint(path, components.denoiser, components, metadata, dtype)
        if folder and not components.is_single_file:
            subfolder = components.family.denoiser_subfolder
            write_pipeline_folder(path.with_suffix(""), components.denoiser, components.model_dir, dtype, subfolder)

    def _write_experts(self, path: Path, metadata: dict[str, str], dtype) -> None:
        """One file per trained expert (``path`` with the expert's name before its suffix),
        its header naming the expert and its noise levels."""
        components = self.parts.components
        ranges = expert_ranges(self.config, components.experts)
        for name, module in self.parts.experts.items():
            target = expert_file(path, name)
            tagged = {**metadata, **expert_metadata(ranges[name])}
            if self.parts.lora:
                models = self.parts.lora_models(name)
                layout = self.config.saving.lora_format
                write_lora(target, models, tagged, dtype, components.family, layout)
            else:
                write_checkpoint(target, module, components, tagged, dtype)

    def _metadata(self, global_step: int, final: bool) -> dict[str, str]:
        """Training metadata; with no_metadata the writers keep only what loaders need."""
        stats, plan, config = self.data_stats, self.plan, self.config
        run = RunInfo(
            num_train_images=stats.num_train_images,
            num_reg_images=stats.num_reg_images,
            num_epochs=plan.epochs,
            epoch=plan.epoch_of_step(max(global_step - 1, 0)) + 1,
            steps=global_step,
            max_train_steps=plan.total_steps,
            gradient_accumulation_steps=plan.accumulation,
            batch_size_per_device=config.datasets[0].batch_size,
            total_batch_size=plan.effective_batch_sizes[0],
            training_started_at=self.started_at,
            training_finished_at=time.time() if final else None,
            tag_frequency=stats.tag_frequency,
            dataset_dirs=stats.dataset_dirs,
            sd_model_name=self.parts.components.model_dir.name,
            resolution=tuple(config.datasets[0].resolution),
            bucket_info=_bucket_info(stats),
            session_id=self.run_id,
            resume_changes=self.resume_changes,
        )
        family = self.parts.components.family
        if self.parts.lora:
            return lora_metadata(config, family, run)
        return unet_metadata(config, family, run)


def _what_failed(failed: SaveError) -> str:
    """"cannot write PATH: REASON" without the error's hint: what follows it says what to do."""
    if failed.path is not None and failed.reason is not None:
        return f"cannot write {failed.path}: {failed.reason}"
    return str(failed)


def _resume_hint(state: Path, failed: SaveError) -> str:
    when = "after freeing space" if failed.reason == NO_SPACE else "once output_dir can be written"
    return f"the last state is {state}; resume from it {when}"



def _bucket_info(stats) -> dict | None:
    """kohya's ss_bucket_info for bucketed runs: every bucket with its samples per epoch."""
    buckets = [b for d in stats.datasets if d.enable_bucket for b in d.buckets]
    if not buckets:
        return None
    return {
        "buckets": {
            str(i): {"resolution": list(b.size), "count": b.samples_per_epoch}
            for i, b in enumerate(buckets)
        }
    }
