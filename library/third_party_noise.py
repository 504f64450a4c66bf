"""Silence third-party start-up messages a user cannot act on, keeping every other warning.

Each entry names the logger and a fragment of the message. bitsandbytes, imported by peft, logs
at import time on CPUs with AVX-512 BF16 that an optional 4-bit kernel package is missing;
difftune never runs 4-bit kernels, so the message only buries our own one-line errors.
"""

from __future__ import annotations

import logging

# (logger name, message fragment)
_UNACTIONABLE = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
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
