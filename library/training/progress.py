"""What the user sees: the plan before the run, the progress bar, and tracker logs."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from library.config.provenance import provenance
from library.config.schema import SECRET_KEYS, Config
from library.data.items import CACHE_FOLDER
from library.data.plan import DatasetStats, DataStats, plan_lines
from library.models.quantized_base import PRECISIONS
from library.plan_json import plan_document
from library.training.adapter_setup import adapter_name, adapter_text
from library.training.plan import RunPlan, save_schedule, save_schedule_lines
from library.training.preflight import start_run
from library.training.resume_rules import change_lines
from library.training.setup import uses_sdpa


def _stats(data) -> DataStats:
    return data if isinstance(data, DataStats) else data.stats


def plan_report(config: Config, data, plan: RunPlan, resume=None, memory=None) -> dict:
    """The run's plan as plain data: what ``--dry_run --json`` prints, and what plan_text
    writes out in words. ``data`` is the TrainData (or its DataStats); ``resume`` the
    ResumeCheck of a resumed run; ``memory`` the dry run's memory estimate (MemoryCheck.report)."""
    stats = _stats(data)
    training, optimizer, net = config.training, config.optimizer, config.network
    origin = provenance(config)
    schedule = save_schedule(config, plan)
    return {
        "config_files": list(origin.files),
        "command_line": list(origin.command_line),
        "model": config.model.pretrained_model_name_or_path,
        "train_mode": net.train_mode,
        "adapter": _adapter_report(config) if net.train_mode == "lora" else None,
        "datasets": [_dataset_report(ds) for ds in stats.datasets],
        "data_scan": dataclasses.asdict(stats.scan) if stats.scan is not None else None,
        "processes": plan.world_size,
        "fsdp": training.fsdp if plan.world_size > 1 else "no",
        "gradient_accumulation_steps": plan.accumulation,
        "effective_batch_sizes": list(plan.effective_batch_sizes),
        "samples_per_epoch": stats.samples_per_epoch,
        "padding_per_epoch": stats.padded_per_epoch,
        "steps_per_epoch": plan.steps_per_epoch,
        "total_steps": plan.total_steps,
        "epochs": plan.epochs,
        "warmup_steps": plan.warmup_steps,
        "learning_rate": optimizer.learning_rate,
        "unet_lr": net.unet_lr,
        "text_encoder_lr": net.text_encoder_lr,
        "lr_scheduler": optimizer.lr_scheduler,
        "optimizer": optimizer.optimizer_type,
        "precision": {
            "mixed_precision": training.mixed_precision,
            "trained_weights": _trained_precision(config),
            "frozen_weights": _frozen_precision(config),
        },
        "seed": training.seed,
        "outputs": {
            "output_dir": config.saving.output_dir,
            "output_name": config.saving.output_name,
            "final": schedule.final,
            "final_kind": schedule.what,
            "final_state": schedule.final_state,
            "saves": [
                {
                    "every": c.every,
                    "unit": c.unit,
                    "count": c.count,
                    "keep_last": c.keep_last,
                    "state": c.state,
                    "keep_last_state": c.keep_last_state if c.state else None,
                }
                for c in schedule.cadences
            ],
        },
        "resume": _resume_report(config, resume),
        "memory": memory,
    }


def _adapter_report(config: Config) -> dict:
    net = config.network
    return {
        "name": adapter_name(config),
        "network_module": net.network_module,
        "rank": net.network_dim,
        "alpha": net.network_alpha,
        "description": adapter_text(config),
    }


def _dataset_report(ds: DatasetStats) -> dict:
    buckets = None
    if ds.enable_bucket or any(b.frames > 1 for b in ds.buckets):
        buckets = [
            {
                "width": b.size[0],
                "height": b.size[1],
                "images": b.images,
                "samples_per_epoch": b.samples_per_epoch,
                "steps_per_epoch": b.steps_per_epoch,
                "padding_per_epoch": b.padded_per_epoch,
                "references": [list(size) for size in b.references],
                "frames": b.frames,
                "tokens": b.tokens,
            }
            for b in ds.buckets
        ]
    return {
        "resolution": list(ds.resolution),
        "batch_size": ds.batch_size,
        "samples_per_step": ds.step_size,
        "subsets": [
            {
                "image_dir": s.image_dir,
                "is_reg": s.is_reg,
                "images": s.images,
                "num_repeats": s.num_repeats,
                "samples_per_epoch": s.samples_per_epoch,
                "unused_images": s.unused_images,
                "reference_images": s.reference_images,
                "references_from": s.references_from,
                "videos": s.videos,
            }
            for s in ds.subsets
        ],
        "train_images": ds.train_images,
        "reg_images": ds.reg_images,
        "samples_per_epoch": ds.samples_per_epoch,
        "padding_per_epoch": ds.padded_per_epoch,
        "steps_per_epoch": ds.steps_per_epoch,
        "micro_batches_per_process": ds.micro_batches_per_process,
        "validation_images": ds.validation_images,
        "skipped_images": ds.skipped_images,
        "short_videos": list(ds.short_videos),
        "tokens_per_sample": sorted({b.tokens for b in ds.buckets if b.tokens is not None}),
        "buckets": buckets,
    }


def _resume_report(config: Config, resume) -> dict | None:
    if resume is None:
        return None
    return {
        "state": config.saving.resume,
        "step": resume.global_step,
        "changes": change_lines(resume.changes),
    }


def plan_text(config: Config, data, plan: RunPlan) -> str:
    """The run's plan in words: data, steps and saves, all counted in optimizer steps. The
    numbers are plan_report's."""
    report = plan_report(config, data, plan)
    adapter = report["adapter"]
    mode = adapter["name"] if adapter else "full UNet"
    lines = [f"difftune plan ({mode} on {report['model']})"]
    lines.append(f"  config files (later ones win): {provenance(config).layers_text()}")
    if adapter:
        lines.append(f"  adapter: {adapter['description']}")
    lines += ["  " + line for line in plan_lines(_stats(data))]
    batches = ", ".join(str(b) for b in report["effective_batch_sizes"])
    precision = report["precision"]
    lines += [
        f"  processes: {report['processes']}, gradient accumulation: "
        f"{report['gradient_accumulation_steps']}, effective batch per optimizer step: "
        f"{batches} (batch x accumulation x processes)"
        + (
            f'; the denoiser sharded over them (fsdp = "{report["fsdp"]}")'
            if report["fsdp"] != "no"
            else ""
        )
        + (
            "; the text encoders sharded over them while they fill the text cache "
            "(fsdp_text_encoder)"
            if report["processes"] > 1 and config.training.fsdp_text_encoder
            else ""
        ),
        f"  optimizer steps per epoch: {report['steps_per_epoch']}, "
        f"total optimizer steps: {report['total_steps']} ({report['epochs']} epochs)",
        f"  learning rate: {report['learning_rate']:g}, {report['lr_scheduler']} "
        f"schedule, {report['warmup_steps']} warmup steps, optimizer {report['optimizer']}",
        f"  precision: {precision['mixed_precision']}, trained weights: "
        f"{precision['trained_weights']}, seed: {report['seed']}",
        f"  frozen weights: {precision['frozen_weights']}",
        f"  attention: {attention_text(config)}",
        *_data_lines(config, _stats(data)),
        "  saves:",
    ]
    lines += ["    " + line for line in save_schedule_lines(config, plan)]
    return "\n".join(lines)


def plan_warnings(trainer) -> list[str]:
    """The plan's warnings (without "warning: "): what the model's family trains instead of
    what the config asks (family_defaults), unreadable images the scan left out, images that
    train enlarged, mostly cropped or as their own reference, sample sizes the model's pipeline
    rounds."""
    lines = list(trainer.family_notes)
    skipped = trainer.data.skipped_images
    if skipped:
        shown = "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
        lines.append(f"{len(skipped)} unreadable images left out: {shown}")
    return lines + list(trainer.data.warnings) + list(trainer.size_notes)


def print_plan_json(trainer) -> None:
    """``--dry_run --json``: the dry run's checks (those of Trainer.run), then the plan as one
    JSON document on stdout, from the main process only. Warnings go to stderr."""
    config, acc = trainer.config, trainer.accelerator
    start = start_run(config, trainer.plan, acc, dry_run=True)
    try:
        memory = trainer.check_model().report()
        if not acc.is_main_process:
            return
        for line in plan_warnings(trainer):
            print(f"warning: {line}", file=sys.stderr)
        report = plan_report(config, trainer.data, trainer.plan, start.resume, memory)
        if trainer.experts_plan is not None:
            report["experts"] = {k: v for k, v in trainer.experts_plan.items() if k != "lines"}
        print(plan_document(report))
    finally:
        start.release()


def _frozen_precision(config: Config) -> str:
    """How the frozen weights are stored on the device: the weight dtype, float8 (fp8_base),
    nf4 or int8 (base_model_precision), and the blocks block swap keeps in host memory."""
    training = config.training
    dtype = {"no": "float32", "fp16": "float16", "bf16": "bfloat16"}[training.mixed_precision]
    text = "float8" if training.fp8_base and not training.fp8_base_unet else dtype
    if config.network.train_mode != "lora":
        return f"text encoders {text} (the denoiser trains)"
    denoiser = dtype
    if training.base_model_precision != "no_change":
        quant = PRECISIONS[training.base_model_precision]
        double = ", double quant" if training.bnb_4bit_use_double_quant else ""
        denoiser = f"{quant} (bitsandbytes{double})"
    elif training.fp8_base or training.fp8_base_unet:
        denoiser = "float8"
    swap = training.blocks_to_swap
    held = f"; the last {swap} blocks' in host memory (blocks_to_swap)" if swap else ""
    return f"denoiser {denoiser}, text encoders {text}{held}"


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


def _cache_folders(config: Config) -> list[str]:
    """Where the disk caches go, as library.data.items places them: a subset's
    cache_directory, else cache_dir, else a folder beside the images."""
    beside = f"{CACHE_FOLDER} inside each image folder"
    subsets = [subset for dataset in config.datasets for subset in dataset.subsets]
    places = [s.cache_directory or config.data.cache_dir or beside for s in subsets]
    return list(dict.fromkeys(places)) or [config.data.cache_dir or beside]


def _cache_place(config: Config, to_disk: bool) -> str:
    if not to_disk:
        return "in memory"
    return f"in memory and on disk ({'; '.join(_cache_folders(config))})"


def _data_lines(config: Config, stats: DataStats) -> list[str]:
    """How latents and text conditioning are obtained, and when validation runs."""
    d = config.data
    latents = _cache_place(config, d.cache_latents_to_disk) if d.latents_cached else None
    text = _cache_place(config, d.cache_text_encoder_outputs_to_disk) if d.text_cached else None
    lines = [
        f"  latents: {'cached ' + latents if latents else 'encoded by the VAE at every step'}",
        f"  text-encoder outputs: {'cached ' + text if text else 'encoded at every step'}",
    ]
    held = stats.validation_images
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

    def __init__(
        self, config: Config, accelerator, plan: RunPlan, initial_step: int, group_names: list[str]
    ):
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
                config=_tracker_config(config) if logging.log_config else None,
                init_kwargs={"wandb": wandb},
            )

    def step(
        self,
        global_step: int,
        loss: float,
        lrs: list[float],
        grad_norm,
        applied: bool = True,
        extra: dict | None = None,
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
        logs = {
            "loss/step": loss,
            "samples_per_second": self.plan.effective_batch_sizes[0] / max(seconds, 1e-9),
        }
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

    def warn(self, line: str) -> None:
        """A warning line above the bar, from the main process (``line`` without "warning: ")."""
        if self.accelerator.is_main_process:
            self.bar.write(f"warning: {line}", file=sys.stderr)

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
