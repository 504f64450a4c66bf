"""Silence third-party messages a user cannot act on, keeping every other warning.

Each entry names exactly one message: the logger that logs it and a fragment of its text, or,
for Python warnings, its category and the start of its text. Nothing else from these libraries is
touched: their other log records and warnings show as before. The messages:

- bitsandbytes (imported by peft) logs at import, on CPUs with AVX-512 BF16, that the optional
  ``kernels`` package for its CPU 4-bit kernel is missing; difftune never runs 4-bit kernels.
- transformers logs, when diffusers' pipelines are built for sample images (or their modules
  imported), that ``CLIPImageProcessor`` / ``SiglipImageProcessor`` fall back to PIL without
  torchvision; difftune never uses those processors (no safety checker, no image prompts).
- diffusers' ``ModelMixin.to(dtype)`` warns that "modules ... should be kept in float32: []"
  whenever a model is cast, even when that list is empty (a full fine-tune casts the denoiser
  to its training dtype). Only the empty-list form is dropped; a model that does keep float32
  modules still warns.
- torch 2.13's DistributedDataParallel warns that ``broadcast_buffers`` is deprecated; accelerate
  passes the trainer's ``broadcast_buffers=False`` (buffers are constants, no per-step
  broadcast), accelerate has no ``forward_sync_buffers`` to pass instead, and torch's own message
  says to keep ``broadcast_buffers=False`` until ``init_sync_buffers`` exists. The other DDP
  message (both arguments given) still shows.

accelerate's "The following values were not passed to `accelerate launch`" is printed by the
``accelerate launch`` process before difftune starts, so no filter here can reach it; README.md
says how to avoid it (``accelerate config default`` once, or ``python train_network.py``).
"""

from __future__ import annotations

import logging
import re
import warnings

# (logger name, message fragment): log records whose message contains the fragment are dropped.
UNACTIONABLE_LOG_RECORDS = (
    (
        "bitsandbytes.backends.cpu.ops",
        "Failed to load CPU gemm_4bit_forward from kernels-community",
    ),
    ("transformers.utils.import_utils", "requires torchvision (not installed); falling back to"),
    ("diffusers.models.modeling_utils", "that should be kept in float32: []. Casting directly"),
)

# (category, start of the message): Python warnings dropped by warnings.filterwarnings.
UNACTIONABLE_WARNINGS = (
    (FutureWarning, "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead."),
)


class _DropFragment(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as it would
            return True
        return self.fragment not in message


def silence_unactionable_messages() -> None:
    """Install the filters (idempotent). Call before the libraries that emit these messages are
    imported: bitsandbytes logs its message at import time."""
    for name, fragment in UNACTIONABLE_LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropFragment) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropFragment(fragment))
    for category, start in UNACTIONABLE_WARNINGS:
        # filterwarnings replaces an identical earlier filter, so repeated calls add nothing
        warnings.filterwarnings("ignore", message=re.escape(start), category=category)


def turn_off_loading_bars() -> None:
    """Turn off the loading progress bars of transformers, diffusers and huggingface_hub (for
    the processes of a multi-process run but the first: each loads the same models, and N
    copies of each bar say nothing the first one does not)."""
    from diffusers.utils import logging as diffusers_logging
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()
    disable_progress_bars()
