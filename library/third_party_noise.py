"""Silence third-party start-up messages a user cannot act on, keeping every other warning.

Each entry names the logger and a fragment of the message. bitsandbytes, imported by peft, logs
at import time on CPUs with AVX-512 BF16 that an optional 4-bit kernel package is missing;
difftune never runs 4-bit kernels, so the message only buries our own one-line errors.
transformers says, when diffusers' SD3 and Flux pipelines are first built for sample images, that
their image processors fall back to PIL without torchvision; difftune never uses them.
"""

from __future__ import annotations

import logging

# (logger name, message fragment)
_UNACTIONABLE = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
    ("transformers.utils.import_utils", "requires torchvision (not installed); falling back"),
)


class _DropFragment(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in str(record.msg)


def silence_unactionable_messages() -> None:
    """Install the filters; call before the libraries that log these messages are imported."""
    for name, fragment in _UNACTIONABLE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropFragment) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropFragment(fragment))
