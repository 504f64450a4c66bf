"""The Trainer: setup, the optimizer-step loop, saving. Read ``train`` top to bottom."""

from __future__ import annotations

import itertools
import math
import signal
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DistributedDataParallelKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    set_seed,
)

from library.config.schema import Config
from library.data.cache_group import CacheGroup
from library.data.dataset import TrainData
from library.data.plan import check_batch_sizes
from library.data.samples import SampleSource
from library.errors import ModelError, TrainingError
from library.models.families.family_choice import entry_for
from library.models.float8 import keep_out_of_ddp
from library.models.loader import load_components
from library.models.model_files import shapes_only
from library.networks.max_norm import apply_max_norm
from library.sampling.generate import check_sampling
from library.sampling.runner import SampleRunner
from library.training.base_weights import non_finite_model_weights
from library.training.caching import (
    build_image_state_cache,
    build_latent_cache,
    build_text_cache,
    build_text_cache_alone,
    cache_group,
    check_bucket_steps,
)
from library.training.ema import WeightAverage
from library.training.experts import expert_plan, expert_routing, move_denoisers, offloads
from library.training.family_defaults import for_family
from library.training.image_sizes import check_image_sizes
from library.training.loss import LossOptions
from library.training.memory_check import MemoryCheck, check_peak_memory
from library.training.memory_estimate import text_encoders_leave_device
from library.training.noise import NoiseOptions
from library.training.optimizers import build_optimizer, optimizer_train_mode
from library.training.plan import RunPlan, make_plan
from library.training.preflight import RunStart, check_launch_layout, start_run
from library.training.progress import ProgressReporter, plan_text, plan_warnings, run_logging_dir
from library.training.reference_checks import (
    check_clip_config,
    check_reference_config,
    check_reference_counts,
    check_sample_frames,
)
from library.training.resume import resume_run
from library.training.resume_rules import change_lines
from library.training.run_summary import RunSummary
from library.training.saver import Saver
from library.training.schedulers import build_scheduler
from library.training.setup import WEIGHT_DTYPES, TrainedParts, allow_fp16_gradients, setup_training
from library.training.sharding import (
    is_sharded,
    set_gradient_sync,
    shard_trained_denoiser,
    shards,
    whole_trained_weights,
)
from library.training.step import StepInputs, micro_batch_loss
from library.training.stops import StopSignals, TrainingStopped, agree_on_step
from library.training.text_sharding import check_text_sharding, shards_text_encoders
from library.training.unreadable import UnreadableImages, left_out_line, stop_error
from library.training.validation_runs import Validator

DEFAULT_DDP_TIMEOUT_MINUTES = 30


@dataclass
class _Loop:
    """What every optimizer step of the loop uses."""

    trained: list[torch.nn.Module]  # the prepared modules that go into accumulate(...)
    params: list[torch.nn.Parameter]
    inputs: StepInputs
    optimizer: torch.optim.Optimizer
    scheduler: object
    saver: Saver
    reporter: ProgressReporter
    signals: StopSignals
    source: SampleSource  # where the loaders take latents from (a cache, or the images)
    unreadable: UnreadableImages  # images that broke while the run trains


@dataclass(frozen=True)
class _StepResult:
    """The outcome of one optimizer-step boundary."""

    loss: float
    grad_norm: float | None
    apply: bool  # False: a non-finite loss under nan_policy = "skip"
    signum: int


def model_line(components) -> str:
    """The model line of the plan: what the loaded model is, and how it is trained."""
    return f"model: {components.family.describe()}; {components.objective.describe()}"


class Trainer:
    """Trains a LoRA or the full UNet as the config says."""

    def __init__(self, config: Config):
        # what the model's family trains, settled before anything reads the config
        config, self.family_notes = for_family(config)
        self.config = config
        self.accelerator = self._make_accelerator()
        self.sharded = shards(config, self.accelerator)  # fsdp over several processes
        training = config.training
        check_reference_config(config)  # reads no weight, nor any image
        frame_rate = check_clip_config(config)  # nor any video
        entry = entry_for(config.model, config.flow)  # a cheap look at the model's files
        family_class = entry.family_of(config.model, config.flow)
        self.data = TrainData(
            config.datasets,
            seed=training.seed,
            accumulation=training.gradient_accumulation_steps,
            world_size=self.accelerator.num_processes,
            prior_loss_weight=training.prior_loss_weight,
            skip_bad_images=config.data.skip_bad_images,
            cache_dir=config.data.cache_dir,
            keep_scan_index=config.data.cache_latents_to_disk or config.data.cache_text_encoder_outputs_to_disk,
            group=CacheGroup() if self.accelerator.num_processes > 1 else None,  # collective
            frame_rate=frame_rate,
            tokens_of=family_class.tokens_per_sample,
        )
        self.plan: RunPlan = make_plan(config, self.data.schedule.steps_per_epoch, self.accelerator.num_processes)
        check_batch_sizes(self.data.stats)  # before any model loads
        check_reference_counts(config, self.data)
        self.sampler = SampleRunner(config, self.accelerator)  # reads the prompts file now
        check_sample_frames(config, self.sampler.prompts)  # reads no weight
        self.size_notes = check_image_sizes(config, self.sampler.prompts)  # reads no weight
        self.family_notes += check_text_sharding(  # reads no weight either
            config, entry, family_class, self.accelerator.num_processes
        )
        self.validator = Validator(config, self.data, self.accelerator)
        self.summary: RunSummary | None = None  # the run summary, while a run holds the name
        self.model_line = ""  # the dry run's model line, once check_model has run
        self.experts_plan: dict | None = None  # a model with experts: their split (expert_plan)

    def _make_accelerator(self) -> Accelerator:
        c = self.config
        t = c.training
        handlers = [
            DistributedDataParallelKwargs(
                find_unused_parameters=False,
                # buffers (e.g. CLIP's position ids) are constants loaded alike on every rank;
                # broadcasting them would add a collective inside every accumulation window
                broadcast_buffers=False,
                gradient_as_bucket_view=t.ddp_gradient_as_bucket_view,
                static_graph=t.ddp_static_graph,
            ),
            InitProcessGroupKwargs(timeout=timedelta(minutes=t.ddp_timeout or DEFAULT_DDP_TIMEOUT_MINUTES)),
        ]
        accelerator = Accelerator(
            gradient_accumulation_steps=c.training.gradient_accumulation_steps,
            mixed_precision=c.training.mixed_precision,
            log_with=c.logging.log_with,
            project_config=ProjectConfiguration(project_dir=c.saving.output_dir, logging_dir=str(run_logging_dir(c))),
            step_scheduler_with_optimizer=False,  # the trainer steps the schedule once per optimizer step
            kwargs_handlers=handlers,
        )
        check_launch_layout(accelerator.num_processes, accelerator.distributed_type)
        if t.full_fp16:
            allow_fp16_gradients(accelerator.scaler)
        return accelerator

    def print_plan(self, start: RunStart | None = None) -> None:
        self.accelerator.print(plan_text(self.config, self.data, self.plan))
        if start is not None and start.resume is not None:
            resume = start.resume
            self.accelerator.print(f"  resuming {self.config.saving.resume} at optimizer step {resume.global_step}")
            for line in change_lines(resume.changes):
                self.accelerator.print(f"    changed since the state was saved: {line}")
        for line in plan_warnings(self):
            self.accelerator.print(f"warning: {line}")

    def check_model(self) -> MemoryCheck:
        """The dry run's model checks, reading no weight: the models built at their shapes on
        the meta device (shapes_only), what trains set up on them, the bucket grid and the
        sample prompts checked against the model, and the peak memory estimated (ConfigError
        when it cannot fit, as at the start of training)."""
        config = self.config
        weight_dtype = WEIGHT_DTYPES[config.training.mixed_precision]
        with shapes_only():
            components = load_components(
                config.model, weight_dtype, config.flow, config.network.network_module
            )
            parts = setup_training(config, components)
        self.model_line = model_line(parts.components)
        self.experts_plan = expert_plan(config, parts.components)
        check_bucket_steps(config, parts.components)
        if self.sampler.prompts:
            check_sampling(parts.components, self.sampler.prompts)
        return check_peak_memory(config, parts, self.data.stats, self.accelerator, bool(self.sampler.prompts))

    def run(self, dry_run: bool = False, config_files: tuple[str, ...] = ()) -> Path | None:
        """Check inputs and outputs, print the plan; unless ``dry_run``, train and return the
        final output's path. The output name is locked for the whole run, and the run summary
        is written while it is (``config_files``: the files the config came from)."""
        start = start_run(self.config, self.plan, self.accelerator, dry_run)
        try:
            self.print_plan(start)
            if dry_run:
                memory = self.check_model()
                self.accelerator.print(f"  {self.model_line}")
                for line in self.experts_plan["lines"] if self.experts_plan else ():
                    self.accelerator.print(f"  {line}")
                self.accelerator.print(memory.line)
                return None
            summary = RunSummary(self.config, self.plan, self.accelerator, start, config_files)
            with summary as self.summary:  # "running" now; the outcome however train() ends
                return self.train(start)
        finally:
            start.release()

    def train(self, start: RunStart) -> Path:
        config, acc, plan = self.config, self.accelerator, self.plan
        weight_dtype = WEIGHT_DTYPES[config.training.mixed_precision]
        # Adapter initialisation draws from the global generator: seed it so a run is reproducible.
        set_seed(config.training.seed)
        components = load_components(
            config.model, weight_dtype, config.flow, config.network.network_module
        )
        parts = setup_training(config, components)
        family = parts.components.family
        acc.print(model_line(parts.components))
        self.experts_plan = expert_plan(config, parts.components)
        for line in self.experts_plan["lines"] if self.experts_plan else ():
            acc.print(f"  {line}")
        check_bucket_steps(config, parts.components)
        memory = check_peak_memory(config, parts, self.data.stats, acc, bool(self.sampler.prompts))
        acc.print(memory.line)
        if self.summary is not None:
            self.summary.memory_estimate = memory.report()
        group = cache_group(config, acc)
        # Text encoders needed only for the text cache fill it alone on the device, then leave
        # it, before the denoiser comes (a 24B encoder and the transformer need not fit at once).
        self._text_leaves = text_encoders_leave_device(
            config, parts, bool(self.sampler.prompts), acc.device.type, acc.num_processes
        )
        # sharded text encoders (fsdp_text_encoder) fill it first too, wherever they are
        fills_first = self._text_leaves or shards_text_encoders(config, acc.num_processes)
        if fills_first:
            # sharded copies encode the sample prompts too: they are freed after the fill
            text_cache = build_text_cache_alone(
                config, self.data, parts.components, weight_dtype, acc, group,
                lambda copies: self.sampler.encode_texts(parts.components, copies),
            )  # fmt: skip
        trained = self._prepare(parts)  # before the optimizer: FSDP replaces the parameters
        optimizer = build_optimizer(config.optimizer, parts.param_groups)
        scheduler = build_scheduler(config.optimizer, optimizer, plan.total_steps)
        optimizer = acc.prepare(optimizer)  # frozen modules are never prepared: DDP would refuse them
        latents = build_latent_cache(config, self.data, parts.components, acc, group)
        layout = family.latent_codec(parts.components.vae).layout
        source = SampleSource(latents, plan.total_steps, layout, family.text_reads_references,
                              family.FIRST_FRAME_CONDITION,
                              *self._image_states(parts, group))  # fmt: skip
        if not fills_first:
            text_cache = build_text_cache(
                config, self.data, parts.components, weight_dtype, acc, group
            )
        if source.latents is not None and not self.sampler.prompts:
            parts.components.vae.to("cpu")  # every latent is cached and nothing is decoded: free its memory
        ema = WeightAverage(parts.parameters(), config.training.ema_decay) if config.training.ema_decay else None
        saver = Saver(config, acc, parts, plan, self.data.stats, start.run_id)
        saver.attach(optimizer, scheduler, ema)
        saver.check_free_space(start.resume.global_step if start.resume else 0)
        global_step = resume_run(self.config, parts, optimizer, scheduler, saver, start, self.accelerator)
        loop = _Loop(
            trained=trained,
            params=parts.parameters(),
            inputs=self._step_inputs(parts, weight_dtype, text_cache),
            optimizer=optimizer,
            scheduler=scheduler,
            saver=saver,
            reporter=ProgressReporter(
                config, acc, plan, global_step, [g["name"] for g in parts.param_groups]
            ),
            signals=StopSignals(),
            source=source,
            unreadable=UnreadableImages(acc, config.data.skip_bad_images),
        )
        optimizer_train_mode(optimizer)  # a resumed schedule-free state may be in eval mode
        self.sampler.attach(parts.components, self._prepared, optimizer)
        self.validator.attach(loop.inputs, loop.source, optimizer)
        self.sampler.at_start(global_step)
        try:
            with loop.signals:
                first = plan.epoch_of_step(global_step)
                batches = self._batches(loop, first, global_step)
                for epoch in range(first, plan.epochs):
                    global_step = self._train_epoch(loop, epoch, global_step, batches)
                    self.sampler.after_epoch(epoch + 1, global_step)
                    if self.validator.due_after_epoch(epoch + 1):
                        self._validate(loop, global_step)
                    if global_step >= plan.total_steps:
                        break
                    saver.after_epoch(epoch + 1, global_step)
            final = saver.at_end(global_step)
        except BaseException:
            loop.reporter.bar.close()  # so an error message starts on its own line
            raise
        loop.reporter.close(final)
        acc.wait_for_everyone()  # every process has finished its last collective
        for tracker in acc.trackers:
            tracker.finish()
        # The process group is not torn down here (accelerate's end_training would): tearing
        # down gloo joins its worker threads with the GIL held, and a worker still releasing a
        # tensor of the last collective needs the GIL, so the process can hang at exit. The
        # entry point ends launched processes with os._exit instead (library/cli.py).
        return final

    def _batches(self, loop: _Loop, first: int, global_step: int) -> Iterator[dict]:
        """This process's micro-batches from ``global_step`` to the end of the run, from one
        loader: its workers start once and load across epoch boundaries."""
        plan, training = self.plan, self.config.training
        loader = self.data.loader(
            first,
            self.accelerator.process_index,
            global_step - first * plan.steps_per_epoch,
            training.max_data_loader_n_workers,
            training.persistent_data_loader_workers,
            loop.source,
            epochs=plan.epochs - first,
        )
        return iter(loader)

    def _train_epoch(self, loop: _Loop, epoch: int, global_step: int, batches: Iterator[dict]) -> int:
        """Run the optimizer steps of one epoch from ``global_step``, taking its micro-batches
        from ``batches``; return the new step count."""
        acc, plan = self.accelerator, self.plan
        start = global_step - epoch * plan.steps_per_epoch
        epoch_batches = itertools.islice(batches, (plan.steps_per_epoch - start) * plan.accumulation)
        loss_sum = torch.zeros((), device=acc.device)
        for micro, batch in enumerate(epoch_batches):
            loop.unreadable.note(batch)
            if loop.inputs.experts is not None:  # the step picks the expert
                loop.inputs.experts.step = global_step
            with acc.accumulate(*loop.trained):
                if self.sharded:  # accelerate's no_sync covers DDP modules, not FSDP ones
                    set_gradient_sync(loop.inputs.denoiser, acc.sync_gradients)
                with acc.autocast():
                    loss = micro_batch_loss(loop.inputs, batch)
                acc.backward(loss)  # DDP all-reduces only on the window's last micro-batch
                loss_sum += loss.detach()
                step = self._sync_point(loop, micro, loss_sum, global_step) if acc.sync_gradients else None
                if step is None or step.apply:
                    loop.optimizer.step()  # a no-op until the window's last micro-batch
                loop.optimizer.zero_grad(set_to_none=True)
            if step is None:
                continue
            # a step dropped for a non-finite loss still consumed its data: the schedule moves on;
            # one the fp16 loss scaler skipped is retried at the same learning rate
            if not (step.apply and acc.optimizer_step_was_skipped):
                loop.scheduler.step()
            extra = self._max_norm(loop) if step.apply else None
            if step.apply and loop.saver.ema is not None:
                loop.saver.ema.update()
            global_step += 1
            loss_sum.zero_()
            loop.reporter.step(global_step, step.loss, loop.scheduler.get_last_lr(), step.grad_norm, step.apply, extra)
            if self.summary is not None:
                self.summary.step(global_step, step.loss, step.apply)
            loop.saver.after_step(global_step)
            self.sampler.after_step(global_step)
            if self.validator.due_after_step(global_step):
                self._validate(loop, global_step)
            if step.signum:
                self._stop_on_signal(step.signum, global_step, loop.saver)
            if global_step >= plan.total_steps:
                break
        return global_step

    def _max_norm(self, loop: _Loop) -> dict | None:
        """kohya's scale_weight_norms after an applied step: the same on every process, since
        every process holds the same weights."""
        limit = self.config.network.scale_weight_norms
        if not limit or not loop.saver.parts.lora:
            return None
        models = list(loop.saver.parts.lora_models().values())
        # sharded: each adapter's norm spans its whole factors, so they are gathered for it
        with whole_trained_weights(models) if self.sharded else nullcontext():
            stats = apply_max_norm(models, limit)
        return {
            "max_norm/keys_scaled": stats.scaled,
            "max_norm/average_key_norm": stats.mean_norm,
            "max_norm/max_key_norm": stats.max_norm,
        }

    def _sync_point(self, loop: _Loop, micro: int, loss_sum: torch.Tensor, global_step: int) -> _StepResult:
        """At the window's last micro-batch: agree on loss and stop signals, then clip."""
        if (micro + 1) % self.plan.accumulation:  # our schedule and accelerate's counter disagree
            raise RuntimeError(f"gradient sync after micro-batch {micro + 1}, inside an accumulation window")
        summary = agree_on_step(
            self.accelerator,
            loss_sum,
            self.plan.accumulation,
            loop.signals.signum,
            len(loop.unreadable.pending),
        )
        if summary.unreadable:  # stops here without skip_bad_images, before the step is applied
            self._on_unreadable(loop, global_step, f"from optimizer step {global_step + 1} on")
        apply = math.isfinite(summary.loss)
        if not apply and self.config.training.nan_policy == "stop":
            self._stop_not_finite(summary.loss, global_step, loop.saver)
        grad_norm = None
        max_norm = self.config.optimizer.max_grad_norm
        if apply and max_norm > 0:
            grad_norm = self.accelerator.clip_grad_norm_(loop.params, max_norm)
            if is_sharded(grad_norm):  # the same on every process, kept as a replicated DTensor
                grad_norm = grad_norm.full_tensor()
        return _StepResult(summary.loss, grad_norm, apply, summary.signum)

    def _stop_not_finite(self, step_loss: float, global_step: int, saver: Saver) -> None:
        """Stop before a non-finite loss reaches the weights; keep the last good state. When the
        model's own weights are not finite, say so (no learning rate would help)."""
        state = saver.stop_state(global_step)
        broken = non_finite_model_weights(saver.parts, global_step, self.sharded)
        if broken:
            more = f" and {len(broken) - 1} more" if len(broken) > 1 else ""
            raise ModelError(
                f"the loss became {step_loss} at optimizer step {global_step + 1} because the "
                f"model's own weights hold NaN or infinite values ({broken[0]}{more}): its "
                f"{broken[0].split('.')[0]} is damaged (pretrained_model_name_or_path "
                f"{self.config.model.pretrained_model_name_or_path}, or the file given for that "
                f"part); re-download or re-convert it. The trained weights were saved to {state}"
            )
        raise TrainingError(
            f"the loss became {step_loss} at optimizer step {global_step + 1}; the weights before it "
            f'were saved to {state}. Lower learning_rate, use mixed_precision = "bf16" instead of '
            'fp16, check the data, or set nan_policy = "skip"'
        )

    def _validate(self, loop: _Loop, global_step: int) -> None:
        """The validation loss after optimizer step ``global_step``; images that cannot be read
        now are left out, or stop the run (training.unreadable)."""
        loss = self.validator.run(loop.unreadable)
        if self.validator.met_unreadable(loop.unreadable):
            self._on_unreadable(loop, global_step, f"of the validation loss from step {global_step} on")
        if loss is not None:
            loop.reporter.validation(global_step, loss)

    def _on_unreadable(self, loop: _Loop, global_step: int, since: str) -> None:
        """Some process met images it could not read: every process learns which; with
        skip_bad_images each is named once and the run goes on, else the state of step
        ``global_step`` is saved (none before the first step) and the run stops."""
        problems = loop.unreadable.agree()
        fresh = loop.unreadable.new(problems)
        if loop.unreadable.skip:
            for problem in fresh:
                loop.reporter.warn(left_out_line(problem, since))
            return
        for problem in problems[1:]:  # the error line names the first
            loop.reporter.warn(problem)
        state = loop.saver.stop_state(global_step) if global_step else None
        raise stop_error(problems, global_step, state)

    def _stop_on_signal(self, signum: int, global_step: int, saver: Saver) -> None:
        state = saver.stop_state(global_step)
        name = signal.Signals(signum).name
        raise TrainingStopped(
            f"stopped by {name} after optimizer step {global_step}; continue with --resume {state}", signum
        )

    def _prepare(self, parts: TrainedParts) -> list[torch.nn.Module]:
        """Move every model to the device; wrap only the trained ones (DDP under several
        processes); with fsdp, shard the denoiser instead (trained or not)."""
        acc, comps = self.accelerator, parts.components
        encoders = () if getattr(self, "_text_leaves", False) else comps.text_encoders
        move_denoisers(self.config, comps, acc.device)
        image = () if comps.image_encoder is None else (comps.image_encoder.model,)
        for module in (comps.vae, *encoders, *image):
            module.to(acc.device)
        if self.sharded:
            shard_trained_denoiser(parts, self.config.training.fsdp, acc.device, acc.num_processes)
        wrapped = [(n, m) for n, m in parts.trained_modules() if not (self.sharded and n == "unet")]
        for _, module in wrapped:
            keep_out_of_ddp(module)  # fp8_base weights: frozen, and not every backend sends float8
        # offload_inactive_dit: accelerate must not move a whole expert onto the device
        placed = None
        if offloads(self.config, comps.experts):
            placed = [not n.startswith("unet") for n, _ in wrapped]
        prepared = acc.prepare(*[m for _, m in wrapped], device_placement=placed) if wrapped else []
        prepared = list(prepared) if isinstance(prepared, (tuple, list)) else [prepared]
        self._prepared = dict(zip([n for n, _ in wrapped], prepared, strict=True))
        if self.sharded:
            self._prepared["unet"] = comps.denoiser
        trained = [self._prepared[name] for name, _ in parts.trained_modules()]
        for module in trained:
            module.train()
        return trained

    def _image_states(self, parts: TrainedParts, group) -> tuple:
        """The image encoder's cache of first-frame states and their shape (with cached latents;
        the encoder then leaves the device: the step reads its states from the cache), else
        (None, None)."""
        image = parts.components.image_encoder
        cache = build_image_state_cache(self.config, self.data, parts.components,
                                        self.accelerator, group)  # fmt: skip
        if cache is None:
            return None, None
        image.model.to("cpu")
        return cache, (image.tokens(), image.width)

    def _step_inputs(self, parts: TrainedParts, weight_dtype, text_cache=None) -> StepInputs:
        comps, training = parts.components, self.config.training
        return StepInputs(
            denoiser=self._prepared.get("unet", comps.denoiser),
            vae=comps.vae,
            family=comps.family,
            objective=comps.objective,
            text_encoders=tuple(self._prepared.get(n, e) for n, e in parts.text_encoders()),
            tokenizers=comps.tokenizers,
            train_text_encoder=parts.train_text_encoder,
            weight_dtype=weight_dtype,
            device=self.accelerator.device,
            seed=training.seed,
            noise=NoiseOptions.from_training(training),
            loss=LossOptions.from_training(training),
            clip_skip=self.config.model.clip_skip,
            max_token_length=self.config.model.max_token_length,
            text_cache=text_cache,
            experts=expert_routing(self.config, parts, self._prepared),
            image_encoder=comps.image_encoder,
        )
