"""Helpers for tests that load our LoRA files with diffusers' own loader."""

from __future__ import annotations

import logging
import warnings


def peft_layers(model) -> list[str]:
    """Paths of the layers diffusers/peft adapted."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [n for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def load_quietly(pipe, path) -> list[str]:
    """``pipe.load_lora_weights(path)``, returning every warning it logged or raised."""
    from diffusers.utils import logging as diffusers_logging

    logger = diffusers_logging.get_logger("diffusers")
    handler, level = _Capture(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipe.load_lora_weights(str(path))  # raises if a key is left unconverted
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return [str(w.message) for w in caught] + handler.messages
