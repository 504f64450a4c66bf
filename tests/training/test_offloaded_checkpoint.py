"""cpu_offload_checkpointing: checkpointed blocks keep their inputs in host memory, and the
gradients are those of plain gradient checkpointing (and of no checkpointing)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from library.config.schema import Config
from library.models.loader import load_components
from library.training import offloaded_checkpoint as offload
from library.training.memory_estimate import estimate_peak_memory
from library.training.meta_activations import TrainingSize, training_activations
from library.training.setup import setup_training


def _config(model_dir, **training):
    return Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        network={"network_train_unet_only": True},
        optimizer={"learning_rate": 1e-4},
        training=training,
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )


def test_stash_moves_tensors_to_the_store_and_leaves_the_rest():
    x, kept = torch.ones(2, 3), torch.zeros(1, device="meta")
    stored = offload.stash((x, None, 3, kept, (x,)), store=torch.device("meta"))
    assert stored[0].device.type == "meta" and stored[0].shape == (2, 3)
    assert stored[1] is None and stored[2] == 3 and stored[3] is kept
    assert stored[4][0] is x  # only positional tensors move, not tensors inside containers


def test_fetch_and_compute_device():
    x = torch.ones(2)
    assert offload.fetch((x, None), torch.device("cpu"))[0] is x
    assert offload.compute_device((None, x)) is None  # everything on the CPU: nothing to offload
    assert offload.compute_device((1, torch.ones(1, device="meta"))) == torch.device("meta")


def test_stashed_inputs_keep_their_gradient_path():
    # the host copy is what the checkpoint keeps: gradients must flow back through the copies
    x = torch.randn(4, requires_grad=True)
    block = torch.nn.Linear(4, 4)
    (copy,) = offload.stash((x.double(),), store=torch.device("cpu"))
    y = offload.checkpoint(lambda v: block(v.float()), copy, use_reentrant=False)
    y.sum().backward()
    expected = block.weight.sum(dim=0)
    torch.testing.assert_close(x.grad, expected)


def _unet_grads(model_dir, **training):
    config = _config(model_dir, **training)
    torch.manual_seed(0)  # the LoRA's initial weights are drawn from the global generator
    parts = setup_training(config, load_components(config.model, torch.float32))
    unet = parts.components.denoiser.train()
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 16, 16, generator=gen)
    context = torch.randn(2, 77, unet.config.cross_attention_dim, generator=gen)
    torch.manual_seed(1)
    unet(latents, torch.tensor([10, 700]), context).sample.square().mean().backward()
    return unet, {n: p.grad.clone() for n, p in unet.named_parameters() if p.requires_grad}


def test_offloaded_checkpointing_gives_the_gradients_of_plain_checkpointing(tiny_model_dir):
    _, none = _unet_grads(tiny_model_dir)
    _, plain = _unet_grads(tiny_model_dir, gradient_checkpointing=True)
    unet, offloaded = _unet_grads(
        tiny_model_dir, gradient_checkpointing=True, cpu_offload_checkpointing=True
    )
    blocks = [m for m in unet.modules() if getattr(m, "gradient_checkpointing", False)]
    assert blocks and all(m._gradient_checkpointing_func is offload.offloaded_checkpoint
                          for m in blocks)  # fmt: skip
    assert none.keys() == plain.keys() == offloaded.keys() and len(none) > 10
    for name in none:
        torch.testing.assert_close(offloaded[name], plain[name], rtol=0, atol=0)
        torch.testing.assert_close(offloaded[name], none[name], rtol=1e-5, atol=1e-6)


def _stats(size: TrainingSize):
    """Data statistics of one dataset whose largest bucket is ``size`` (what the estimate
    reads of them)."""
    dataset = SimpleNamespace(buckets=[], resolution=(size.width, size.height),
                              batch_size=size.batch)  # fmt: skip
    return SimpleNamespace(datasets=[dataset])


def test_the_estimate_leaves_the_offloaded_block_inputs_out(tiny_model_dir):
    size = TrainingSize(128, 128, 2)

    config = _config(tiny_model_dir, gradient_checkpointing=True, cpu_offload_checkpointing=True)
    parts = setup_training(config, load_components(config.model, torch.float32))
    on_gpu = estimate_peak_memory(config, parts, _stats(size), 1, False, "cuda")
    on_cpu = estimate_peak_memory(config, parts, _stats(size), 1, False, "cpu")
    assert on_gpu.offloaded and not on_cpu.offloaded  # host memory is a CPU run's device memory
    assert on_cpu.activations == training_activations(config, parts, size)
    assert 0 < on_gpu.activations < on_cpu.activations
    assert on_gpu.activations == training_activations(config, parts, size, offloaded=True)


def test_offload_without_checkpointing_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="set gradient_checkpointing = true too"):
        _config(tiny_model_dir, cpu_offload_checkpointing=True)


def test_a_run_too_large_for_the_device_is_pointed_at_the_offload(tiny_model_dir):
    from library.training.memory_check import _remedies

    assert "turn on gradient_checkpointing" in _remedies(_config(tiny_model_dir))
    checkpointed = _remedies(_config(tiny_model_dir, gradient_checkpointing=True))
    assert "turn on cpu_offload_checkpointing" in checkpointed
    both = _config(tiny_model_dir, gradient_checkpointing=True, cpu_offload_checkpointing=True)
    assert "cpu_offload_checkpointing" not in _remedies(both)
