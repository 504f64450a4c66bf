"""Saving on cadence: weights and states, written by the main process, met by all at a barrier."""

from __future__ import annotations

import time
from pathlib import Path

from library.config.schema import Config
from library.saving.metadata import RunInfo, lora_metadata, unet_metadata
from library.saving.outputs import OutputLayout
from library.saving.writers import SAVE_DTYPES, write_checkpoint, write_lora, write_pipeline_folder
from library.training.ema import WeightAverage
from library.training.optimizers import optimizer_eval_mode, optimizer_train_mode
from library.training.plan import RunPlan
from library.training.setup import TrainedParts
from library.training.state import Progress, save_state


class Saver:
    """Writes the run's outputs; every method is called on every process."""

    def __init__(self, config: Config, accelerator, parts: TrainedParts, plan: RunPlan, data_stats):
        self.config, self.accelerator, self.parts, self.plan = config, accelerator, parts, plan
        self.layout = OutputLayout(config.saving)
        self.data_stats = data_stats
        self.started_at = time.time()
        self.optimizer = self.scheduler = self.ema = None

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
        )

    def after_step(self, global_step: int) -> None:
        if self.layout.step_due(global_step, self.plan.total_steps):
            path = self.layout.step_file(global_step)
            self._save(path, global_step, with_state=self.config.saving.save_state)
            if self.accelerator.is_main_process:
                self.layout.prune_steps(global_step)

    def after_epoch(self, epoch: int, global_step: int) -> None:
        """``epoch`` is 1-based: the number of epochs completed."""
        if self.layout.epoch_due(epoch, self.plan.epochs) and global_step < self.plan.total_steps:
            path = self.layout.epoch_file(epoch)
            self._save(path, global_step, with_state=self.config.saving.save_state)
            if self.accelerator.is_main_process:
                self.layout.prune_epochs(epoch)

    def at_end(self, global_step: int) -> Path:
        saving = self.config.saving
        self._save(self.layout.final, global_step, with_state=False, final=True)
        if saving.save_state or saving.save_state_on_train_end:
            self.save_state(self.layout.final_state, global_step)
        return self.layout.final

    def save_state(self, path: Path, global_step: int) -> None:
        if self.accelerator.is_main_process:
            save_state(
                path,
                self.parts.trained_weights(),
                self.optimizer,
                self.scheduler,
                self.accelerator.scaler,
                self.progress(global_step),
                ema=self.ema.state_dict() if self.ema else None,
            )
        self.accelerator.wait_for_everyone()

    def _save(self, path: Path, global_step: int, with_state: bool, final: bool = False) -> None:
        # schedule-free optimizers hold the weights to save only while in eval mode
        optimizer_eval_mode(self.optimizer)
        try:
            if self.accelerator.is_main_process:
                self._write_weights(path, global_step, final)
            self.accelerator.wait_for_everyone()
        finally:
            optimizer_train_mode(self.optimizer)
        if with_state:
            self.save_state(self.layout.state_of(path), global_step)

    def _write_weights(self, path: Path, global_step: int, final: bool) -> None:
        metadata = self._metadata(global_step, final)
        self._write_model(path, metadata, folder=final)
        if self.ema is not None:
            with self.ema.swapped_in():
                ema_metadata = {**metadata, "ss_ema_decay": str(self.ema.decay)}
                self._write_model(self.layout.ema_of(path), ema_metadata, folder=False)

    def _write_model(self, path: Path, metadata: dict[str, str], folder: bool) -> None:
        """The trained weights as they are now: a LoRA file, or an original-layout checkpoint
        (and, at the end, a diffusers folder when the base model was one)."""
        dtype = SAVE_DTYPES[self.config.saving.save_precision]
        if self.parts.lora:
            write_lora(path, self.parts.lora_models(), metadata, dtype)
            return
        components = self.parts.components
        write_checkpoint(path, components.unet, components, metadata, dtype)
        if folder and not components.is_single_file:
            write_pipeline_folder(path.with_suffix(""), components.unet, components.model_dir, dtype)

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
        )
        family = self.parts.components.family
        if self.parts.lora:
            return lora_metadata(config, family, run)
        return unet_metadata(config, family, run)


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
