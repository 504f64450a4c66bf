"""What the user sees: the plan before the run, the progress bar, and tracker logs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tqdm.auto import tqdm

from library.config.schema import SECRET_KEYS, Config
from library.data.plan import plan_lines
from library.training.adapter_setup import adapter_name, adapter_text
from library.training.plan import RunPlan, save_schedule_lines
from library.training.setup import uses_sdpa


def plan_text(config: Config, data, plan: RunPlan) -> str:
    """The run's plan: data, steps and saves, all counted in optimizer steps."""
    training = config.training
    lora = config.network.train_mode == "lora"
    mode = adapter_name(config) if lora else "full UNet"
    lines = [f"difftune plan ({mode} on {config.model.pretrained_model_name_or_path})"]
    if lora:
        lines.append(f"  adapter: {adapter_text(config)}")
    lines += ["  " + line for line in plan_lines(data)]
    batches = ", ".join(str(b) for b in plan.effective_batch_sizes)
    lines += [
        f"  processes: {plan.world_size}, gradient accumulation: {plan.accumulation}, "
        f"effective batch per optimizer step: {batches} (batch x accumulation x processes)",
        f"  optimizer steps per epoch: {plan.steps_per_epoch}, "
        f"total optimizer steps: {plan.total_steps} ({plan.epochs} epochs)",
        f"  learning rate: {config.optimizer.learning_rate:g}, {config.optimizer.lr_scheduler} "
        f"schedule, {plan.warmup_steps} warmup steps, optimizer {config.optimizer.optimizer_type}",
        f"  precision: {training.mixed_precision}, trained weights: {_trained_precision(config)}, "
        f"seed: {training.seed}",
        f"  attention: {attention_text(config)}",
        *_data_lines(config, data),
        "  saves:",
    ]
    lines += ["    " + line for line in save_schedule_lines(config, plan)]
    return "\n".join(lines)


def _trained_precision(config: Config) -> str:
    training = config.training
    if training.full_bf16:
        return "bfloat16 (full_bf16)"
    return "float16 (full_fp16)" if training.full_fp16 else "float32"


def attention_text(config: Config) -> str:
    """Which attention runs, and how kohya's attention switches map onto it."""
    training = config.training
    if not uses_sdpa(config):
        return "plain (sdpa = false)"
    served = [k for k in ("xformers", "mem_eff_attn") if getattr(training, k)]
    note = f"; {' and '.join(served)} = true served by it" if served else ""
    return (
        "torch scaled-dot-product attention (PyTorch picks a flash or memory-efficient kernel "
        f"where the device and dtype have one, else the math kernel){note}"
    )


def _cache_place(config: Config, to_disk: bool) -> str:
    if not to_disk:
        return "in memory"
    where = config.data.cache_dir or ".difftune_cache inside each image folder"
    return f"in memory and on disk ({where})"


def _data_lines(config: Config, data) -> list[str]:
    """How latents and text conditioning are obtained, and when validation runs."""
    d = config.data
    latents = _cache_place(config, d.cache_latents_to_disk) if d.latents_cached else None
    text = _cache_place(config, d.cache_text_encoder_outputs_to_disk) if d.text_cached else None
    lines = [
        f"  latents: {'cached ' + latents if latents else 'encoded by the VAE at every step'}",
        f"  text-encoder outputs: {'cached ' + text if text else 'encoded at every step'}",
    ]
    held = getattr(data, "num_validation_images", 0)
    if held:
        if d.validate_every_n_steps:
            when = f"every {d.validate_every_n_steps} optimizer steps"
        elif d.validate_every_n_epochs:
            when = f"every {d.validate_every_n_epochs} epochs"
        else:
            when = "after every epoch"
        lines.append(f"  validation: {held} held-out images, {when}, at fixed timesteps and noise")
    return lines


def run_logging_dir(config: Config) -> Path:
    """This run's tracker folder: <logging_dir>/<log_prefix><date-time>, like kohya's."""
    logging = config.logging
    return Path(logging.logging_dir) / f"{logging.log_prefix or ''}{time.strftime('%Y%m%d-%H%M%S')}"


def _tracker_config(config: Config) -> dict:
    """Flat scalar hyper-parameters for the tracker (TensorBoard hparams accept no lists)."""
    flat = {}
    for section, values in config.model_dump(exclude={"datasets", "notices"}).items():
        for key, value in values.items():
            if key not in SECRET_KEYS and isinstance(value, (int, float, str, bool)):
                flat[f"{section}/{key}"] = value
    return flat


class ProgressReporter:
    """A progress bar on the main process and, if configured, tracker logs per optimizer step."""

    def __init__(self, config: Config, accelerator, plan: RunPlan, initial_step: int, group_names: list[str]):
        self.accelerator = accelerator
        self.group_names = group_names
        self.plan = plan
        self.bar = tqdm(
            total=plan.total_steps,
            initial=initial_step,
            desc="steps",
            unit="step",
            dynamic_ncols=True,
            smoothing=0.1,
            disable=not accelerator.is_main_process,
        )
        self.epoch_losses: list[float] = []
        self.skipped = 0  # optimizer steps dropped for a non-finite loss (nan_policy = "skip")
        self.validation_loss: float | None = None  # the latest, shown on the bar
        self.postfix: dict[str, object] = {}
        self.last_time = time.perf_counter()
        if config.logging.log_with:
            logging, run = config.logging, Path(accelerator.logging_dir).name
            if logging.wandb_api_key and logging.log_with in ("wandb", "all"):
                os.environ.setdefault("WANDB_API_KEY", logging.wandb_api_key)
            wandb = {"name": logging.wandb_run_name or run, "dir": str(accelerator.logging_dir)}
            accelerator.init_trackers(
                logging.log_tracker_name or config.saving.output_name,
                config=_tracker_config(config),
                init_kwargs={"wandb": wandb},
            )

    def step(
        self, global_step: int, loss: float, lrs: list[float], grad_norm, applied: bool = True, extra: dict | None = None
    ) -> None:
        """Called on every process once per optimizer step (the loss is already reduced);
        ``extra`` holds further values to log (e.g. max-norm statistics)."""
        now = time.perf_counter()
        seconds, self.last_time = now - self.last_time, now
        if applied:
            self.epoch_losses.append(loss)
        else:
            self.skipped += 1
        self.bar.update(1)
        postfix = {"loss": f"{loss:.4f}", "lr": f"{lrs[0]:.2e}"}
        if self.skipped:
            postfix["skipped"] = self.skipped
        if self.validation_loss is not None:
            postfix["val"] = f"{self.validation_loss:.4f}"
        self.postfix = postfix
        self.bar.set_postfix(postfix, refresh=False)
        logs = {"loss/step": loss, "samples_per_second": self.plan.effective_batch_sizes[0] / max(seconds, 1e-9)}
        if self.skipped:
            logs["skipped_steps"] = self.skipped
        for name, lr in zip(self.group_names, lrs, strict=True):
            logs[f"lr/{name}"] = lr
        if grad_norm is not None:
            logs["grad_norm"] = float(grad_norm)
        logs.update(extra or {})
        if global_step % self.plan.steps_per_epoch == 0 and self.epoch_losses:
            logs["loss/epoch"] = sum(self.epoch_losses) / len(self.epoch_losses)
            self.epoch_losses.clear()
        self.accelerator.log(logs, step=global_step)

    def validation(self, global_step: int, loss: float) -> None:
        """Show and log a validation loss computed after optimizer step `global_step`."""
        self.validation_loss = loss
        self.postfix["val"] = f"{loss:.4f}"
        self.bar.set_postfix(self.postfix)
        self.accelerator.log({"loss/validation": loss}, step=global_step)

    def close(self, final: Path) -> None:
        self.bar.close()
        if not self.accelerator.is_main_process:  # accelerate's print is once per machine
            return
        if self.skipped:
            print(f"{self.skipped} optimizer steps were skipped for a non-finite loss")
        print(f"saved {final}")
