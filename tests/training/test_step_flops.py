"""Model FLOPs of a training step (library/training/step_flops.py): the meta count equals the
count of a real forward and backward pass on the CPU, leaves gradient checkpointing's second
forward out, and keeps the rule that a backward pass costs one forward per input gradient and
one per weight gradient."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from library.config.schema import Config
from library.models.conditioning import assemble_conditioning, encode_text, plain_sizes
from library.models.loader import load_components
from library.training.meta_activations import TrainingSize
from library.training.setup import setup_training
from library.training.step_flops import micro_batch_flops, step_flops

SIZE = TrainingSize(64, 64, 2)


def _config(model_dir, network=None, training=None, data=None):
    return Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        network=network or {},
        optimizer={"learning_rate": 1e-4},
        training=training or {},
        data=data or {},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )


def _parts(config):
    return setup_training(config, load_components(config.model, torch.float32))


def _real_flops(parts, backward=True) -> tuple[int, int]:
    """(text, denoiser forward + backward) FLOPs of a real float32 micro-batch of SIZE. Its
    attention runs in plain products: PyTorch's counter has no formula for the CPU's fused
    attention kernel, and the products are what the GPU's fused kernels are counted as."""
    with sdpa_kernel(SDPBackend.MATH):
        return _counted(parts, backward)


def _counted(parts, backward: bool) -> tuple[int, int]:
    comps = parts.components
    text_counter, counter = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with text_counter, torch.no_grad():
        text = encode_text(comps.family, comps.tokenizers, comps.text_encoders,
                           [""] * SIZE.batch, "cpu")  # fmt: skip
    batch = plain_sizes(SIZE.batch, SIZE.height, SIZE.width)
    cond = assemble_conditioning(comps.family, text, batch, "cpu")
    latents = torch.randn(SIZE.batch, 4, SIZE.height // 8, SIZE.width // 8)
    comps.denoiser.train()
    with counter:
        out = comps.family.predict(comps.denoiser, latents, torch.tensor([500, 500]), cond)
        if backward:
            out.float().square().mean().backward()
    return text_counter.get_total_flops(), counter.get_total_flops()


def test_meta_count_equals_a_real_step_and_leaves_recomputation_out(tiny_model_dir):
    unet_only = {"network_train_unet_only": True}
    plain = _config(tiny_model_dir, network=unet_only)
    text, real = _real_flops(_parts(plain))
    assert micro_batch_flops(plain, _parts(plain), SIZE) == real + text
    # checkpointing computes each block's forward twice; model FLOPs count it once
    checkpointed = _config(tiny_model_dir, network=unet_only,
                           training={"gradient_checkpointing": True})  # fmt: skip
    assert micro_batch_flops(checkpointed, _parts(checkpointed), SIZE) == real + text
    # cached captions: the frozen text encoders do not run in the step
    cached = _config(tiny_model_dir, network=unet_only,
                     data={"cache_text_encoder_outputs": True})  # fmt: skip
    assert micro_batch_flops(cached, _parts(cached), SIZE) == real


@pytest.mark.parametrize(("train_mode", "ratio"), [("unet", 3.0), ("lora", 2.0)])
def test_backward_costs_a_forward_per_gradient_kind(tiny_model_dir, train_mode, ratio):
    # a frozen base needs the input gradients only (one forward's worth); a whole-model
    # fine-tune needs the weight gradients too (another); LoRA's own products are small
    # rank 1: the adapters' own products are small beside the tiny UNet's
    config = _config(tiny_model_dir, network={"train_mode": train_mode, "network_dim": 1,
                     "network_train_unet_only": True},
                     data={"cache_text_encoder_outputs": True})  # fmt: skip
    parts = _parts(config)
    _, forward = _real_flops(parts, backward=False)
    assert micro_batch_flops(config, parts, SIZE) / forward == pytest.approx(ratio, rel=0.08)


def test_a_step_is_its_micro_batches(tiny_model_dir):
    one = _config(tiny_model_dir, network={"network_train_unet_only": True})
    three = _config(tiny_model_dir, network={"network_train_unet_only": True},
                    training={"gradient_accumulation_steps": 3})  # fmt: skip
    assert step_flops(three, _parts(three), SIZE) == 3 * micro_batch_flops(one, _parts(one), SIZE)
