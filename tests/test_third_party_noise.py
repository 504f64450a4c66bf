"""Unactionable third-party start-up messages are dropped; other warnings still show."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = """
import logging
from library.third_party_noise import silence_unactionable_messages
silence_unactionable_messages()
import peft  # imports bitsandbytes, which logs the 4-bit kernel message on AVX-512 BF16 CPUs
log = logging.getLogger("bitsandbytes.backends.cpu.ops")
log.warning("Failed to load CPU gemm_4bit_forward from kernels-community: synthetic")
log.warning("a real problem the user must see")
import diffusers
diffusers.StableDiffusion3Pipeline  # transformers' torchvision fallback note for its processors
"""


def test_only_the_unactionable_message_is_dropped():
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "gemm_4bit_forward" not in result.stderr
    assert "requires torchvision" not in result.stderr
    assert "a real problem the user must see" in result.stderr
