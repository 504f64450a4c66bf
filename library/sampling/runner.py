"""When to sample, and the object the trainer holds to do it (mirrors the Saver)."""

from __future__ import annotations

from library.config.sampling_schema import SamplingSection
from library.sampling.generate import SampleRound, check_sampling, sample_images
from library.sampling.prompts import SamplePrompt, load_prompts
from library.sampling.samplers import check_zero_terminal_snr
from library.sampling.texts import encode_sample_texts, text_encoder
from library.training.optimizers import optimizer_eval_mode, optimizer_train_mode
from library.training.sharding import shards


def due_after_step(sampling: SamplingSection, step: int) -> bool:
    """sample_every_n_steps divides ``step`` (an optimizer step count, >= 1)."""
    every = sampling.sample_every_n_steps
    return bool(every) and step > 0 and step % every == 0


def due_after_epoch(sampling: SamplingSection, epoch: int) -> bool:
    """sample_every_n_epochs divides ``epoch`` (1-based: the number of epochs completed)."""
    every = sampling.sample_every_n_epochs
    return bool(every) and epoch > 0 and epoch % every == 0


class SampleRunner:
    """Samples on the configured cadence; every method is called on every process.

    The prompts file is read in the constructor, so a bad file stops the run before the models
    load, and it is read only then: a file edited during training changes no round. A step is
    sampled at most once, even when the step and epoch cadences meet on it.
    """

    def __init__(self, config, accelerator=None):
        self.sampling: SamplingSection = config.sampling
        self.output_dir = config.saving.output_dir
        self.output_name = config.saving.output_name
        self.accelerator = accelerator
        # a sharded denoiser computes only with every process taking part
        several = accelerator is not None and accelerator.num_processes > 1
        self.lockstep = several and shards(config, accelerator)
        self.prompts: list[SamplePrompt] = []
        if self.sampling.sample_prompts:
            self.prompts = load_prompts(
                self.sampling.sample_prompts, self.sampling, config.training.seed
            )
        # getattr: clip_skip and zero_terminal_snr are new in ModelSection.
        self.clip_skip = getattr(config.model, "clip_skip", None)
        self.max_token_length = getattr(config.model, "max_token_length", None)
        if self.prompts and getattr(config.model, "zero_terminal_snr", False):
            for name in dict.fromkeys(p.sampler for p in self.prompts):
                if name is not None:  # None: DDIM, which can
                    check_zero_terminal_snr(name, f"sample_prompts {self.sampling.sample_prompts}")
        self.components = self.optimizer = None
        # samples switch a model's experts where training splits them (unset: the model's own)
        self.boundary: float | None = config.experts.boundary_fraction
        self.prepared: dict = {}
        self._last_step: int | None = None
        # the prompts' text states, when they were encoded ahead (encode_texts)
        self.texts: dict | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.prompts)

    def attach(self, components, prepared=None, optimizer=None) -> None:
        """The run's Components (live modules); optionally ``prepared``, the prepared modules by
        name ("unet", "text_encoder", "text_encoder_2"; those missing are taken from the
        Components), and the optimizer (a schedule-free one is switched to its averaged weights
        while sampling).

        Raises ConfigError when sampling is on and the model cannot be sampled as the prompts
        ask (no pipeline for its family, or a sampler its objective cannot use).
        """
        if self.enabled:
            check_sampling(components, self.prompts)
        self.components, self.prepared = components, dict(prepared or {})
        self.optimizer = optimizer

    def encode_texts(self, components, encoders) -> None:
        """Encode every prompt's texts now with ``encoders`` (the text encoders or their sharded
        copies, on the device) and sample with those states from then on, never calling the
        text encoders again (texts.py). Called on every process alike (sharded encoders are
        collectives); nothing to do without prompts."""
        if not self.enabled:
            return
        device = self.accelerator.device if self.accelerator is not None else "cpu"
        encode = text_encoder(components, encoders, device, self.accelerator,
                              self.clip_skip, self.max_token_length)  # fmt: skip
        self.texts = encode_sample_texts(self.prompts, encode)

    def at_start(self, global_step: int) -> SampleRound | None:
        """Before the first optimizer step of this run (``global_step`` > 0 when resuming)."""
        return self._sample(global_step) if self.sampling.sample_at_first else None

    def after_step(self, global_step: int) -> SampleRound | None:
        return self._sample(global_step) if due_after_step(self.sampling, global_step) else None

    def after_epoch(self, epoch: int, global_step: int) -> SampleRound | None:
        """``epoch`` is 1-based; call it after every epoch, the last one included."""
        if due_after_epoch(self.sampling, epoch):
            return self._sample(global_step)
        return None

    def _sample(self, global_step: int) -> SampleRound | None:
        if not self.enabled or self._last_step == global_step:
            return None
        if self.components is None:
            raise RuntimeError("SampleRunner.attach(components) must be called before sampling")
        self._last_step = global_step
        if self.optimizer is None:  # sampling without training (tests, tools)
            return self._round(global_step)
        optimizer_eval_mode(self.optimizer)
        try:
            return self._round(global_step)
        finally:
            optimizer_train_mode(self.optimizer)

    def _round(self, global_step: int) -> SampleRound:
        return sample_images(
            self.components,
            self.prompts,
            step=global_step,
            output_dir=self.output_dir,
            output_name=self.output_name,
            accelerator=self.accelerator,
            prepared=self.prepared,
            clip_skip=self.clip_skip,
            max_token_length=self.max_token_length,
            lockstep=self.lockstep,
            video_format=self.sampling.sample_video_format,
            boundary=self.boundary,
            texts=self.texts,
        )
