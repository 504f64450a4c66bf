"""The memory estimate counts the process's own memory beside its tensors: the interpreter or
the CUDA context, and what the allocator keeps of the transient memory at the peak (the step's
activations, or the VAE encoding's intermediates where the encoding holds more)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from library.training.memory_check import estimate_line, show_bytes
from library.training.memory_estimate import estimate_peak_memory, update_bytes
from library.training.meta_activations import TrainingSize, encoding_bytes, training_activations
from library.training.process_memory import (
    CUDA_CONTEXT_BYTES,
    INTERPRETER_BYTES,
    KEPT_PER_TRANSIENT_BYTE,
)
from tests.training.memory_helpers import SIZE, size_stats, training_parts, write_config

FIXED = {"cpu": INTERPRETER_BYTES, "cuda": CUDA_CONTEXT_BYTES}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_step_sets_the_peak_the_allocator_keeps_its_activations(tiny_model_dir, device):
    config = write_config(tiny_model_dir.parent, {
        "pretrained_model_name_or_path": str(tiny_model_dir), "network_module": "networks.lora",
        "network_dim": 4, "cache_latents": True})  # fmt: skip
    parts = training_parts(config)
    found = estimate_peak_memory(config, parts, size_stats(), 1, False, device)
    activations = training_activations(config, parts, SIZE, False, device)
    transient = max(activations, update_bytes(config, parts, device, 1))
    assert found.step >= found.encoding  # the step holds more than caching's encoding
    expected = FIXED[device] + round(KEPT_PER_TRANSIENT_BYTE[device] * transient)
    assert found.process == expected
    assert found.total == found.weights + found.step + expected
    line = estimate_line(found, torch.device(device), None)
    assert f"about {show_bytes(found.total)} peak" in line
    assert ("interpreter + allocator" if device == "cpu" else "CUDA context") in line


def test_the_encoding_sets_the_peak_the_allocator_keeps_its_intermediates(tiny_model_dir):
    # four 512 px images encoded at once at caching hold more than a step of two at 512 px
    config = write_config(tiny_model_dir.parent, {
        "pretrained_model_name_or_path": str(tiny_model_dir), "network_module": "networks.lora",
        "network_train_unet_only": True, "gradient_checkpointing": True,
        "cache_latents": True, "vae_batch_size": 4})  # fmt: skip
    parts = training_parts(config)
    stats = SimpleNamespace(datasets=[SimpleNamespace(buckets=[], resolution=(512, 512),
                                                      batch_size=2)])  # fmt: skip
    found = estimate_peak_memory(config, parts, stats, 1, False, "cpu")
    assert found.encoding > found.step
    # the VAE's intermediates come and go; the allocator keeps their pages
    encode = encoding_bytes(parts, TrainingSize(512, 512, 2), 4)
    kept = round(KEPT_PER_TRANSIENT_BYTE["cpu"] * encode)
    assert found.process == INTERPRETER_BYTES + kept
    assert found.total == found.weights + found.encoding + INTERPRETER_BYTES + kept


def test_other_devices_get_no_process_term(tiny_model_dir):
    config = write_config(
        tiny_model_dir.parent,
        {"pretrained_model_name_or_path": str(tiny_model_dir), "network_module": "networks.lora"},
    )
    found = estimate_peak_memory(config, training_parts(config), size_stats(), 1, False, "mps")
    assert found.process == 0 and found.total == found.tensors
