"""``check --loader diffusers``: the family's pipeline runs its own ``load_lora_weights`` on the
file (diffusers' key conversion, then peft); afterwards each module's weight change in the adapted
model is compared with the file's. A module diffusers did not load, or loaded with another
change, is reported with what diffusers logged."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch
from torch import nn

from library.errors import ConfigError
from library.lora_tools.adapters import remove_adapters
from library.lora_tools.base_model import Layer
from library.lora_tools.file_modules import FileModules, report_unreadable
from library.lora_tools.loader_report import Report
from library.models.model_files import one_line
from library.networks.lycoris import file_math
from library.sampling.pipelines import build_pipeline

_ADAPTER = "difftune_check"  # the adapter name the file is loaded under, then unloaded


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _captured(call: Callable[[], object]) -> tuple[Exception | None, list[str]]:
    """Run ``call``; (the exception it raised or None, what diffusers/peft/transformers warned),
    with their own log output held back (the report says what matters)."""
    handler = _Capture()
    loggers = [logging.getLogger(name) for name in ("diffusers", "peft", "transformers")]
    saved = [(logger.level, logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.WARNING)
    error = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - reported, whatever diffusers raised
                error = exc
    finally:
        for logger, (level, handlers, propagate) in zip(loggers, saved, strict=True):
            logger.handlers = handlers
            logger.propagate = propagate
            logger.setLevel(level)
    messages = handler.messages + [str(w.message) for w in caught]
    return error, [m for m in messages if "lora" in m.lower() or "key" in m.lower()]


def check_diffusers(found: FileModules, tensors, metadata, components, table, source) -> Report:
    """diffusers' own pipeline.load_lora_weights on the file, then each module's change."""
    report = Report("diffusers")
    pipe = loaded_pipeline(components)
    error, messages = _captured(lambda: pipe.load_lora_weights(str(source), adapter_name=_ADAPTER))
    try:
        if error is not None:
            report.drop(tensors, f"diffusers' load_lora_weights fails: {_failure(error)}")
            return report
        report_unreadable(report, found, metadata, components)
        for name, parts in sorted(found.modules.items()):
            reason = _diffusers_module(table[name], parts)
            if reason is None:
                continue
            keys = found.keys[name]
            if reason.startswith("dora:"):
                keys = [k for k in keys if k.endswith("dora_scale")]
                reason = reason.removeprefix("dora:")
            report.drop(keys, reason)
        if report.dropped:
            report.notes += [f"diffusers said: {one_line(Exception(m))}" for m in messages[:3]]
    finally:
        _captured(pipe.unload_lora_weights)
        for model in (components.denoiser, *components.text_encoders):
            remove_adapters(model)
    return report


def _failure(error: Exception) -> str:
    """An exception in one line, with where it was raised when its message says little."""
    import traceback

    text = one_line(error)
    frames = traceback.extract_tb(error.__traceback__)
    if frames and len(str(error).strip()) < 20:
        last = frames[-1]
        where = "/".join(last.filename.replace("\\", "/").split("/")[-3:])
        text = f"{type(error).__name__} {str(error).strip()} in {where}, {last.name}()".replace(
            "  ", " "
        )
    return text


def loaded_pipeline(components):
    """The family's diffusers pipeline over the loaded modules (library.sampling)."""
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

    flow = components.family.prediction_type == "flow"
    scheduler = (
        FlowMatchEulerDiscreteScheduler()
        if flow
        else DDIMScheduler(steps_offset=1, clip_sample=False, set_alpha_to_one=False)
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build_pipeline(
                components, components.denoiser, components.text_encoders, scheduler
            )
    except ConfigError as exc:
        raise ConfigError(f"--loader diffusers: {exc}") from None


def _peft_delta(module: nn.Module) -> torch.Tensor | None:
    """The weight change peft's adapter ``_ADAPTER`` makes to ``module`` (None without one)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not isinstance(module, BaseTunerLayer):
        return None
    for attr in ("lora_A", "lokr_w1", "lokr_w1_a", "hada_w1_a"):
        holder = getattr(module, attr, None)
        if holder is not None and _ADAPTER in holder:
            return module.get_delta_weight(_ADAPTER).detach().float()
    return None


def _diffusers_module(layer: Layer, parts) -> str | None:
    """Why diffusers' adapted model does not reproduce a module's change (None if it does)."""
    try:
        expected = file_math.module_delta(parts, layer.shape)
    except ValueError:
        return None  # nothing to compare with; the difftune check names the problem
    got = [_peft_delta(layer.model.get_submodule(path)) for path in layer.parts]
    if all(delta is None for delta in got):
        return f"diffusers loaded nothing into {', '.join(layer.parts)}"
    if any(delta is None for delta in got):
        missing = [p for p, d in zip(layer.parts, got, strict=True) if d is None]
        return f"diffusers loaded only some parts: nothing into {', '.join(missing)}"
    for path, want, have in zip(layer.parts, layer.split(expected), got, strict=True):
        have = have.reshape(want.shape)
        scale = float(want.abs().max()) or 1.0
        error = float((have - want).abs().max()) / scale
        if error > 1e-3:
            return f"diffusers applies another change to {path} (off by {error:.1%} of its size)"
    if "dora_scale" in parts:
        module = layer.model.get_submodule(layer.parts[0])
        if not getattr(module, "use_dora", {}).get(_ADAPTER, False):
            return "dora:diffusers drops DoRA's dora_scale (the magnitude is not applied)"
    return None
