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


def load_quietly(pipe, path, untrained: tuple[str, ...] = ()) -> list[str]:
    """``pipe.load_lora_weights(path)``, returning every warning it logged or raised, except
    diffusers' note that the file holds no keys for a component named in ``untrained`` (a text
    encoder the family never adapts, such as Chroma's T5)."""
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
    messages = [str(w.message) for w in caught] + handler.messages
    quiet = tuple(f"prefix='{name}'" for name in untrained)
    return [
        m
        for m in messages
        if not (m.startswith("No LoRA keys associated to") and any(q in m for q in quiet))
    ]
