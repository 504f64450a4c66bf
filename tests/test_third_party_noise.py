"""Unactionable third-party messages are dropped; every other warning still shows.

A real tiny run prints on stderr only our own lines (``warning:``, ``error:``) and progress bars.
For each silenced message, the same library's similar but different warnings still show, so no
filter can swallow more than its one message. Everything runs in fresh Python processes with the
libraries' default verbosity (conftest.py turns transformers and diffusers down to errors).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from library.third_party_noise import (
    UNACTIONABLE_LOG_RECORDS,
    UNACTIONABLE_WARNINGS,
    silence_unactionable_messages,
)
from tests.integration.harness import make_images, write_config

REPO = Path(__file__).resolve().parents[1]

# A progress bar as tqdm draws it: "steps:  50%|█████     | 1/2 [00:01<00:01, ...]".
_PROGRESS = re.compile(r"^[^|]*\d+%\|.*\| *\d+/\d+ ")
# Our own line formats on stderr (library/cli.py prints config notices and errors this way).
_OURS = re.compile(r"^(warning|error): ")


def _clean_env() -> dict[str, str]:
    """The user's environment: the libraries' own log verbosity (conftest lowers it)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DIFFUSERS_VERBOSITY", "TRANSFORMERS_VERBOSITY")
    }
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _python(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _lines(stderr: str) -> list[str]:
    """stderr split at newlines and at tqdm's carriage returns, blank lines dropped."""
    return [line for line in re.split(r"[\r\n]+", stderr) if line.strip()]


@pytest.mark.integration
@pytest.mark.subprocess
def test_a_real_run_prints_only_our_own_lines_and_progress_bars(tmp_path, tiny_model_dir):
    """A full fine-tune (the denoiser is cast: diffusers' float32 note) that samples an image
    (diffusers builds the pipeline: transformers' torchvision note), with peft imported
    (bitsandbytes' kernels note on AVX-512 BF16 CPUs) and one ignored kohya key (our warning)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle --w 64 --h 64 --s 2\n", encoding="utf-8")
    config = write_config(
        tmp_path / "c.toml",
        tiny_model_dir,
        make_images(tmp_path / "imgs", 2),
        tmp_path / "out",
        train_mode="unet",
        max_train_steps=1,
        sample_prompts=str(prompts),
        sample_every_n_steps=1,
        lowram=True,  # ignored by difftune: our own "warning:" line must still show
    )
    done = _python("train_network.py", "--config", str(config))
    assert done.returncode == 0, done.stderr
    lines = _lines(done.stderr)
    foreign = [line for line in lines if not (_OURS.match(line) or _PROGRESS.match(line))]
    assert foreign == [], "\n".join(foreign)
    assert any(
        line.startswith("warning: ") and "lowram = true is ignored" in line for line in lines
    )
    assert list((tmp_path / "out" / "sample").glob("*.png")), "the run sampled no image"


# One process exercises every silenced message and its near neighbours; each test below reads
# its own section of the output. Paths come in argv: a tiny model folder and a scratch folder.
_SCRIPT = r"""
import logging, sys, warnings
from library.third_party_noise import silence_unactionable_messages
silence_unactionable_messages()

model, scratch = sys.argv[1], sys.argv[2]

def section(name):
    print(f"=== {name}", file=sys.stderr, flush=True)

section("bitsandbytes")
import peft  # imports bitsandbytes, which logs its kernels note on AVX-512 BF16 CPUs
log = logging.getLogger("bitsandbytes.backends.cpu.ops")
# the note as bitsandbytes words it, for CPUs without AVX-512 BF16 (where it is not logged)
log.warning(
    "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you "
    "already `pip install kernels` and the kernels >= 0.11.1", "No module named 'kernels'"
)
log.warning("Failed to load CPU gemm_4bit_backward: an unrelated kernel problem")
logging.getLogger("bitsandbytes.cextension").warning("bitsandbytes library load error: example")

section("transformers")
import transformers
transformers.CLIPImageProcessor  # falls back to its PIL twin without torchvision: dropped
transformers.SiglipImageProcessor  # the same note for another processor: dropped
logging.getLogger("transformers.utils.import_utils").warning(
    "`FooTokenizer` requires sentencepiece (not installed); install sentencepiece"
)
# a real warning: a text encoder checkpoint missing a weight (the load report)
transformers.CLIPTextModel.from_pretrained(scratch + "/bad_text_encoder")

section("diffusers")
import torch
from diffusers import UNet2DConditionModel
unet = UNet2DConditionModel.from_pretrained(model + "/unet")
unet.to(torch.float16)  # "should be kept in float32: []": nothing to keep, dropped
unet._keep_in_fp32_modules = ["conv_in"]
unet.to(torch.float32)  # a model that keeps a module in float32: the warning shows

section("torch")
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo", init_method=f"file://{scratch}/pg", rank=0, world_size=1)
DistributedDataParallel(torch.nn.Linear(2, 2), broadcast_buffers=False)  # dropped
DistributedDataParallel(torch.nn.Linear(2, 2), broadcast_buffers=False, forward_sync_buffers=False)
dist.destroy_process_group()
encoder = transformers.CLIPTextModel.from_pretrained(model + "/text_encoder")
encoder.gradient_checkpointing_enable()  # another library's FutureWarning: shows
warnings.warn("a deprecation of something the user set", FutureWarning)

section("end")
"""


@pytest.fixture(scope="module")
def sections(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    scratch = tmp_path_factory.mktemp("noise")
    bad = scratch / "bad_text_encoder"
    bad.mkdir()
    (bad / "config.json").write_bytes(
        (tiny_model_dir / "text_encoder" / "config.json").read_bytes()
    )
    weights = load_file(tiny_model_dir / "text_encoder" / "model.safetensors")
    dropped = next(k for k in sorted(weights) if k.endswith("layer_norm1.weight"))
    save_file(
        {k: v for k, v in weights.items() if k != dropped},
        bad / "model.safetensors",
        {"format": "pt"},
    )
    done = _python("-c", _SCRIPT, str(tiny_model_dir), str(scratch))
    assert done.returncode == 0, done.stderr
    parts = re.split(r"^=== (\w+)\n", done.stderr, flags=re.M)
    found = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert list(found) == ["bitsandbytes", "transformers", "diffusers", "torch", "end"], done.stderr
    return found


@pytest.mark.subprocess
def test_bitsandbytes_kernels_note_is_dropped_its_other_warnings_show(sections):
    out = sections["bitsandbytes"]
    assert "gemm_4bit_forward" not in out
    assert "Failed to load CPU gemm_4bit_backward: an unrelated kernel problem" in out
    assert "bitsandbytes library load error: example" in out


@pytest.mark.subprocess
def test_transformers_torchvision_note_is_dropped_its_other_warnings_show(sections):
    out = sections["transformers"]
    assert "requires torchvision" not in out
    assert "`FooTokenizer` requires sentencepiece (not installed)" in out
    assert "LOAD REPORT" in out and "MISSING" in out  # the checkpoint that lacks a weight


@pytest.mark.subprocess
def test_diffusers_empty_float32_note_is_dropped_a_real_one_shows(sections):
    out = sections["diffusers"]
    assert "should be kept in float32: []" not in out
    assert "should be kept in float32: ['conv_in']" in out


@pytest.mark.subprocess
def test_ddp_broadcast_buffers_note_is_dropped_other_future_warnings_show(sections):
    out = sections["torch"]
    assert "`broadcast_buffers` is deprecated. Use `forward_sync_buffers`" not in out
    assert "Both `broadcast_buffers` and `forward_sync_buffers` were specified" in out
    assert "`gradient_checkpointing_enable` is deprecated" in out
    assert "a deprecation of something the user set" in out


def test_installing_twice_adds_no_second_filter():
    kept = warnings.filters[:]
    try:
        silence_unactionable_messages()
        silence_unactionable_messages()
        for name, fragment in UNACTIONABLE_LOG_RECORDS:
            mine = [
                f
                for f in logging.getLogger(name).filters
                if getattr(f, "fragment", None) == fragment
            ]
            assert len(mine) == 1, name
        for category, start in UNACTIONABLE_WARNINGS:
            mine = [f for f in warnings.filters if f[2] is category and f[1] and f[1].match(start)]
            assert len(mine) == 1, start
    finally:
        warnings.filters[:] = kept
