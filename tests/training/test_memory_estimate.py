"""The peak-memory estimate: activations counted on meta copies, weights and optimizer state,
and the stop before training when the estimate exceeds the device."""

from __future__ import annotations

import functools
import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from library.config.schema import Config
from library.models.conditioning import assemble_conditioning, encode_text, plain_sizes
from library.models.loader import load_components
from library.training import memory_check, memory_estimate
from library.training import trainer as trainer_module
from library.training.activation_memory import activation_bytes, meta_copy
from library.training.block_swap import swap_linears
from library.training.memory_estimate import (
    optimizer_state_bytes,
    trained_state_bytes,
    update_bytes,
    weight_bytes,
)
from library.training.meta_activations import TrainingSize, encoding_bytes, training_activations
from library.training.optimizers import build_optimizer, optimizer_kwargs
from library.training.setup import setup_training
from tests.integration.harness import make_images, train, write_config
from tests.training.memory_helpers import profiled_peak

F32, BF16 = 4, 2  # bytes per element


def _config(model_dir, network=None, optimizer=None, training=None, data=None):
    return Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        network=network or {},
        optimizer={"learning_rate": 1e-4, **(optimizer or {})},
        training=training or {},
        data=data or {},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )


def _parts(config, weight_dtype=torch.float32):
    return setup_training(config, load_components(config.model, weight_dtype))


# --- activations of hand-built modules ---------------------------------------------------------


def test_sequential_activations_are_the_leaf_outputs_counted_by_hand():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),  # [2, 8, 16, 16]
        torch.nn.ReLU(),  # [2, 8, 16, 16]
        torch.nn.Conv2d(8, 4, 3, stride=2, padding=1),  # [2, 4, 8, 8]
        torch.nn.Flatten(),  # a view of the conv's output: nothing new
        torch.nn.Linear(4 * 8 * 8, 10),  # [2, 10]
    )
    by_hand = (2 * 8 * 16 * 16 + 2 * 8 * 16 * 16 + 2 * 4 * 8 * 8 + 2 * 10) * F32
    assert activation_bytes(model, torch.zeros(2, 3, 16, 16)) == by_hand


def test_under_autocast_norms_count_in_float32_and_the_rest_in_half():
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32),  # [4, 32] bf16
        torch.nn.LayerNorm(32),  # [4, 32] float32, as autocast runs it
        torch.nn.SiLU(),  # [4, 32] float32: it follows its input
        torch.nn.Linear(32, 8),  # [4, 8] bf16: autocast casts its input back
    )
    by_hand = 4 * 32 * BF16 + 4 * 32 * F32 + 4 * 32 * F32 + 4 * 8 * BF16
    assert activation_bytes(model, torch.zeros(4, 16), autocast=torch.bfloat16) == by_hand


class _Blocks(torch.nn.Module):
    """Three blocks run the way diffusers runs checkpointed blocks."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
            for _ in range(3)
        )
        self.gradient_checkpointing = False
        self._gradient_checkpointing_func = None

    def enable_checkpointing(self):
        self.gradient_checkpointing = True
        self._gradient_checkpointing_func = functools.partial(
            torch.utils.checkpoint.checkpoint, use_reentrant=False
        )

    def forward(self, x):
        for block in self.blocks:
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                x = self._gradient_checkpointing_func(block, x)
            else:
                x = block(x)
        return x


def test_checkpointing_keeps_block_outputs_and_the_largest_block():
    model = _Blocks()
    per_block = (4 * 32 + 4 * 32 + 4 * 16) * F32  # Linear, ReLU, Linear outputs
    output = 4 * 16 * F32
    x = torch.zeros(4, 16)
    assert activation_bytes(model, x) == 3 * per_block
    model.enable_checkpointing()
    assert activation_bytes(model, x) == 3 * output + per_block


def test_meta_copy_leaves_the_module_alone():
    model = torch.nn.Linear(4, 4)
    before = model.weight.detach().clone()
    copied = meta_copy(model, torch.bfloat16)
    assert copied.weight.device.type == "meta" and copied.weight.dtype == torch.bfloat16
    assert model.weight.device.type == "cpu" and model.weight.dtype == torch.float32
    assert torch.equal(model.weight, before)


# --- the UNet against a real, profiled forward and backward ------------------------------------


def _real_unet_peak(parts, size: TrainingSize) -> int:
    """Peak memory of a real float32 forward + backward of the UNet on the CPU."""
    comps = parts.components
    with torch.no_grad():
        text = encode_text(
            comps.family, comps.tokenizers, comps.text_encoders, [""] * size.batch, "cpu"
        )
    cond = assemble_conditioning(
        comps.family, text, plain_sizes(size.batch, size.height, size.width), "cpu"
    )
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(size.batch, 4, size.height // 8, size.width // 8, generator=generator)
    timesteps = torch.randint(0, 1000, (size.batch,), generator=generator)

    def step():
        out = comps.denoiser(latents, timesteps, cond.encoder_hidden_states, **cond.unet_kwargs).sample
        out.float().square().mean().backward()

    comps.denoiser.train()
    return profiled_peak(step)


def _saved_by_autograd(parts, size: TrainingSize, autocast: torch.dtype | None) -> int:
    """Bytes of the tensors autograd saves for backward in a real forward pass of the UNet
    (each storage once; the model's own weights left out), seen by saved-tensor hooks."""
    comps = parts.components
    with torch.no_grad():
        text = encode_text(comps.family, comps.tokenizers, comps.text_encoders,
                           [""] * size.batch, "cpu")  # fmt: skip
    cond = assemble_conditioning(
        comps.family, text, plain_sizes(size.batch, size.height, size.width), "cpu"
    )
    latents = torch.randn(size.batch, 4, size.height // 8, size.width // 8)
    weights = {t.untyped_storage().data_ptr() for t in comps.denoiser.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    comps.denoiser.train()
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None),
    ):
        comps.denoiser(latents, torch.tensor([500] * size.batch), cond.encoder_hidden_states,
                       **cond.unet_kwargs)  # fmt: skip
    return sum(saved.values())


@pytest.mark.parametrize("precision", ["no", "bf16"])
@pytest.mark.parametrize("model", ["tiny_model_dir", "tiny_sdxl_model_dir"])
def test_lora_activations_are_what_autograd_saves(request, model, precision):
    # the UNet with a LoRA on its default targets, in float32 or under bf16 autocast (the
    # frozen weights stored in bf16, the adapters in float32)
    config = _config(request.getfixturevalue(model), network={"network_train_unet_only": True},
                     training={"mixed_precision": precision})  # fmt: skip
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    parts = _parts(config, dtype)
    size = TrainingSize(128, 128, 2)
    saved = _saved_by_autograd(parts, size, None if precision == "no" else dtype)
    # the CPU's autocast: normalisation in its input's dtype (CUDA's keeps it in float32)
    estimate = training_activations(config, parts, size, device_type="cpu")
    assert estimate == pytest.approx(saved, rel=0.15)


@pytest.mark.parametrize("model", ["tiny_model_dir", "tiny_sdxl_model_dir"])
def test_unet_estimate_is_within_2x_of_theprofiled_peak(request, model):
    model_dir = request.getfixturevalue(model)
    size = TrainingSize(128, 128, 2)
    measured = {}
    for checkpointing in (False, True):
        config = _config(
            model_dir,
            network={"network_train_unet_only": True},
            training={"gradient_checkpointing": checkpointing},
        )
        parts = _parts(config)
        estimate = training_activations(config, parts, size)
        real = _real_unet_peak(parts, size)
        assert real / 2 <= estimate <= real * 2, (checkpointing, estimate, real)
        measured[checkpointing] = (estimate, real)
    assert measured[True][0] < measured[False][0]  # checkpointing lowers the estimate
    assert measured[True][1] < measured[False][1]  # ... and the real peak


def test_trained_text_encoder_and_larger_batches_add_activations(tiny_model_dir):
    unet_only = _config(tiny_model_dir, network={"network_train_unet_only": True})
    both = _config(tiny_model_dir)
    small, large = TrainingSize(128, 128, 1), TrainingSize(128, 128, 3)
    base = training_activations(unet_only, _parts(unet_only), small)
    assert training_activations(both, _parts(both), small) > base
    assert training_activations(unet_only, _parts(unet_only), large) > 2.5 * base


def test_plain_attention_adds_the_attention_matrices(tiny_model_dir):
    sdpa = _config(tiny_model_dir, network={"network_train_unet_only": True})
    plain = _config(
        tiny_model_dir, network={"network_train_unet_only": True}, training={"sdpa": False}
    )
    size = TrainingSize(128, 128, 1)
    # The tiny SD 1.x UNet (tests/kits/sd/tiny.py) has 8 heads everywhere (attention_head_dim
    # 8 is the head count in diffusers' SD 1.x naming). Its attention level sees 16x16 latents
    # (256 tokens) in 3 transformer blocks (1 down, 2 up); the mid block sees 8x8 (64 tokens).
    # Each block has self-attention and cross-attention over 77 text tokens; the probabilities
    # are kept in float32.
    level, mid = 256, 64
    expected = 3 * 8 * level * (level + 77) * F32 + 8 * mid * (mid + 77) * F32
    added = training_activations(plain, _parts(plain), size) - training_activations(
        sdpa, _parts(sdpa), size
    )
    assert added == expected


# --- weights and trained state ----------------------------------------------------------------


def _bytes(tensors) -> int:
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def _module_tensors(module):
    return itertools.chain(
        (t for _, t in module.named_parameters()), (t for _, t in module.named_buffers())
    )


def test_weights_count_every_model_on_the_device(tiny_model_dir):
    config = _config(tiny_model_dir, data={"cache_latents": True})
    parts = _parts(config)
    comps = parts.components
    models = sum(_bytes(_module_tensors(m)) for m in (comps.denoiser, comps.text_encoder))
    vae = _bytes(_module_tensors(comps.vae))
    # every latent cached and no samples drawn: the trainer moves the VAE off the device
    assert weight_bytes(config, parts, draws_samples=False) == models
    assert weight_bytes(config, parts, draws_samples=True) == models + vae


@pytest.mark.parametrize(
    ("data", "subset", "network", "samples", "leave"),
    [
        ({"cache_text_encoder_outputs": True}, {}, {"network_train_unet_only": True}, False, True),
        ({}, {}, {"network_train_unet_only": True}, False, False),  # encoded in every step
        ({"cache_text_encoder_outputs": True}, {"shuffle_caption": True},
         {"network_train_unet_only": True}, False, False),  # captions vary: encoded as met
        ({"cache_text_encoder_outputs": True}, {}, {"network_train_unet_only": True}, True,
         False),  # sample prompts are encoded
    ],
)  # fmt: skip
def test_text_encoders_needed_only_for_the_cache_leave_the_device(
    tiny_model_dir, data, subset, network, samples, leave
):
    config = Config(
        model={"pretrained_model_name_or_path": str(tiny_model_dir)}, network=network,
        optimizer={"learning_rate": 1e-4}, data=data,
        datasets=[{"subsets": [{"image_dir": "unused", **subset}]}],
    )  # fmt: skip
    parts = _parts(config)
    comps = parts.components
    text = _bytes(_module_tensors(comps.text_encoder))
    unet = _bytes(_module_tensors(comps.denoiser))
    vae = _bytes(_module_tensors(comps.vae))
    assert memory_estimate.text_encoders_leave_device(config, parts, samples) is leave
    assert weight_bytes(config, parts, samples) == unet + vae + (0 if leave else text)
    # on the CPU, host memory is the device's: they stay
    assert not memory_estimate.text_encoders_leave_device(config, parts, samples, "cpu")
    stats = SimpleNamespace(datasets=[SimpleNamespace(buckets=[], resolution=(64, 64),
                                                      batch_size=1)])  # fmt: skip
    found = memory_estimate.estimate_peak_memory(config, parts, stats, 1, samples, "cuda")
    # while they fill the cache they are alone on the device
    assert found.text_caching == (text if leave else 0)
    assert found.tensors == max(found.weights + max(found.step, found.encoding), found.text_caching)


def test_on_the_cpu_the_vae_and_swapped_blocks_count_as_the_devices_memory(tiny_model_dir):
    # moving the VAE "off the device" or a block "to host memory" moves nothing on the CPU
    config = _config(tiny_model_dir, data={"cache_latents": True})
    parts = _parts(config)
    comps = parts.components
    vae = _bytes(_module_tensors(comps.vae))
    on_gpu = weight_bytes(config, parts, draws_samples=False)
    assert weight_bytes(config, parts, False, device_type="cpu") == on_gpu + vae
    block = comps.denoiser.down_blocks[0]
    frozen = [m for m in block.modules()
              if type(m) is torch.nn.Linear and not m.weight.requires_grad]  # fmt: skip
    host = sum(_bytes(_module_tensors(m)) for m in frozen)
    largest = max(m.weight.numel() for m in frozen)
    assert host > 0
    swap_linears([block])
    # on a GPU: the swapped weights leave the device, one fetched layer comes back at a time
    # (its stored float32 copy, and the cast for the product)
    assert weight_bytes(config, parts, False) == on_gpu - host + largest * (F32 + F32)
    assert weight_bytes(config, parts, False, device_type="cpu") == (
        on_gpu + vae + largest * (F32 + F32)
    )


@pytest.mark.parametrize("cached", [False, True])
def test_the_vae_encoding_is_the_peak_when_it_holds_more_than_the_step(tiny_model_dir, cached):
    # the encoding is counted once: with the trained state in each step, or at caching with
    # the VAE back on the device (training moves it off)
    config = _config(tiny_model_dir, network={"network_train_unet_only": True},
                     training={"gradient_checkpointing": True},
                     data={"cache_latents": cached, "vae_batch_size": 4})  # fmt: skip
    parts = _parts(config)
    size = TrainingSize(512, 512, 2)
    stats = SimpleNamespace(datasets=[SimpleNamespace(buckets=[], resolution=(512, 512),
                                                      batch_size=2)])  # fmt: skip
    found = memory_estimate.estimate_peak_memory(config, parts, stats, 1, False, "cuda")
    vae = _bytes(_module_tensors(parts.components.vae))
    if cached:
        expected = encoding_bytes(parts, size, 4) + vae
    else:
        expected = encoding_bytes(parts, size, 2) + found.trained_state
    assert found.encoding == expected
    assert found.tensors == found.weights + max(found.step, found.encoding)
    assert encoding_bytes(parts, size, 2) > encoding_bytes(parts, size, 1)
    line = memory_check.estimate_line(found, torch.device("cuda"), None)
    # four images at a time at caching hold more than the step; two in the step, less
    assert ("; the peak is the VAE encoding images (" in line) == cached
    assert (found.encoding > found.step) == cached


def _optimizer_parts(sizes: list[list[int]]):
    """Trained parts of float32 parameters with gradients, in groups of the given sizes."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(n)) for n in group]} for group in sizes]
    params = [p for g in groups for p in g["params"]]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    return SimpleNamespace(param_groups=groups, parameters=lambda: params), params


@pytest.mark.parametrize("optimizer_args", [[], ["foreach=True"], ["fused=True"]])
def test_adamw_update_temporaries_equal_a_profiled_step(tiny_model_dir, optimizer_args):
    config = _config(tiny_model_dir, optimizer={"optimizer_args": optimizer_args})
    parts, params = _optimizer_parts([[200_000, 300_000], [100_000, 50_000]])
    optimizer = build_optimizer(config.optimizer, parts.param_groups)
    optimizer.step()  # the state exists from here on
    measured = profiled_peak(optimizer.step)
    estimate = update_bytes(config, parts, "cpu", 1)
    # foreach: the denominator of the largest group at once; fused: none; per parameter: the
    # square root and the denominator of one parameter while the previous one's denominator
    # is still held (3 x the largest bounds it; here 200k + 2 x 300k elements). Each step also
    # makes a few scalar tensors (bias corrections).
    expected = {"": (3 * 300_000 * F32, 800_000 * F32), "foreach=True": (500_000 * F32,) * 2,
                "fused=True": (0, 0)}["".join(optimizer_args)]  # fmt: skip
    assert estimate == expected[0]
    assert expected[1] <= measured <= expected[1] + 4096
    assert update_bytes(_config(tiny_model_dir), parts, "cuda", 1) == 500_000 * F32  # foreach
    lion = _config(tiny_model_dir, optimizer={"optimizer_type": "Lion"})
    assert update_bytes(lion, parts, "cuda", 1) == 0


def test_mixed_precision_adds_autocast_copies_of_float32_trained_weights(tiny_model_dir):
    config = _config(tiny_model_dir, training={"mixed_precision": "bf16"})
    parts = _parts(config, torch.bfloat16)
    comps = parts.components
    models = sum(_bytes(_module_tensors(m)) for m in (comps.denoiser, comps.text_encoder, comps.vae))
    trained = sum(p.numel() for p in parts.parameters())
    assert weight_bytes(config, parts, draws_samples=True) == models + trained * BF16


def _real_state_bytes(config, parts) -> int:
    """Bytes of the optimizer state after one real step (per-parameter scalars left out)."""
    optimizer = build_optimizer(config.optimizer, parts.param_groups)
    for p in parts.parameters():
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()
    tensors = [t for state in optimizer.state.values() for t in state.values()]
    # bitsandbytes shares one quantisation map per state kind: count each tensor once
    return _bytes(t for t in tensors if isinstance(t, torch.Tensor) and t.dim() > 0)


@pytest.mark.parametrize(
    "optimizer",
    [
        {"optimizer_type": "AdamW"},
        {"optimizer_type": "Lion"},
        {"optimizer_type": "SGDNesterov"},
        {"optimizer_type": "Prodigy", "learning_rate": 1.0},
        {"optimizer_type": "Adafactor", "lr_scheduler": "adafactor"},
        {
            "optimizer_type": "Adafactor",
            "lr_scheduler": "adafactor",
            "optimizer_args": ["beta1=0.9"],
        },
        {"optimizer_type": "AdamW8bit"},
        {"optimizer_type": "Lion8bit"},
        {"optimizer_type": "PagedAdamW32bit"},
    ],
)
@pytest.mark.parametrize("train_mode", ["lora", "unet"])
def test_optimizer_state_equals_a_real_optimizers_state(tiny_model_dir, optimizer, train_mode):
    config = _config(tiny_model_dir, network={"train_mode": train_mode}, optimizer=optimizer)
    parts = _parts(config)
    kwargs = optimizer_kwargs(config.optimizer)
    name = config.optimizer.optimizer_type
    estimate = optimizer_state_bytes(name, parts.parameters(), kwargs)
    # Prodigy keeps a copy of the starting weights, as a scalar where they are all zero (LoRA's
    # up weights, some UNet biases); the estimate counts the full copy
    zero = _bytes(p for p in parts.parameters() if not p.any()) if name == "Prodigy" else 0
    # bitsandbytes' quantisation maps (256 floats per state kind, shared by the tensors with
    # 8-bit state) are left out
    quantised = any(p.numel() >= 4096 for p in parts.parameters())
    maps = {"AdamW8bit": 2, "Lion8bit": 1}.get(name, 0) * 256 * F32 if quantised else 0
    assert estimate == _real_state_bytes(config, parts) + zero - maps


def test_full_bf16_keeps_adamw_state_in_bfloat16(tiny_model_dir):
    config = _config(tiny_model_dir, training={"mixed_precision": "bf16", "full_bf16": True})
    parts = _parts(config, torch.bfloat16)
    numel = sum(p.numel() for p in parts.parameters())
    assert optimizer_state_bytes("AdamW", parts.parameters(), {}) == 2 * numel * BF16
    assert _real_state_bytes(config, parts) == 2 * numel * BF16


def test_8bit_optimizers_keep_one_byte_per_state_for_large_tensors():
    big, small = torch.nn.Parameter(torch.zeros(64, 64)), torch.nn.Parameter(torch.zeros(8, 8))
    # a byte per element and a float32 scale per 256 elements; bitsandbytes keeps 32-bit state
    # for tensors under 4096 elements
    big_state = 4096 + 4096 // 256 * F32
    assert optimizer_state_bytes("AdamW8bit", [big, small], {}) == 2 * big_state + 2 * 64 * F32
    assert optimizer_state_bytes("Lion8bit", [big], {}) == big_state


def test_trained_state_adds_gradients_ddp_buckets_and_ema(tiny_model_dir):
    plain = _config(tiny_model_dir)
    parts = _parts(plain)
    params = parts.parameters()
    grads = _bytes(params)
    adam = 2 * grads  # float32 weights: two float32 states
    assert trained_state_bytes(plain, parts, world_size=1) == grads + adam
    assert trained_state_bytes(plain, parts, world_size=2) == 2 * grads + adam
    ema = _config(tiny_model_dir, training={"ema_decay": 0.99})
    assert trained_state_bytes(ema, parts, world_size=1) == grads + adam + grads  # float32 copy


def test_fsdp_splits_the_denoisers_trained_state_over_the_processes(tiny_model_dir):
    """Full UNet, 2 processes: gradients, Adam's state and the EMA at half (the real optimizer
    state, measured); accumulation adds the whole gradients it sums between reductions. The
    text encoder's LoRA is not sharded: its share stays whole."""
    keys = {"fsdp": "full_shard", "ema_decay": 0.9}
    unet = _config(tiny_model_dir, network={"train_mode": "unet"}, training=keys)
    parts = _parts(unet)
    grads = _bytes(parts.parameters())
    whole = grads + _real_state_bytes(unet, parts) + grads  # gradients, Adam, float32 EMA
    assert trained_state_bytes(unet, parts, world_size=2) == math.ceil(whole / 2)
    assert trained_state_bytes(unet, parts, world_size=1) == whole  # nothing to shard with
    accumulating = _config(
        tiny_model_dir, network={"train_mode": "unet"},
        training={**keys, "gradient_accumulation_steps": 2},
    )  # fmt: skip
    assert trained_state_bytes(accumulating, parts, world_size=2) == math.ceil(whole / 2) + grads
    lora = _config(tiny_model_dir, training={"fsdp": "full_shard"})
    parts = _parts(lora)
    text = [p for g in parts.param_groups if g["name"].startswith("text") for p in g["params"]]
    unet_params = [p for g in parts.param_groups if g["name"] == "unet" for p in g["params"]]
    assert text and unet_params
    expected = 2 * _bytes(text) + 2 * _bytes(text)  # gradient + DDP bucket, AdamW's 2 states
    expected += math.ceil(3 * _bytes(unet_params) / 2)  # gradient and 2 states, halved
    assert trained_state_bytes(lora, parts, world_size=2) == expected


def test_fsdp_weights_hold_a_slice_plus_what_is_gathered(tiny_model_dir):
    """full_shard: half the UNet plus its two largest blocks and its root layers, less than the
    whole UNet; shard_grad_op: half plus the whole (every block stays gathered until its
    backward pass), so more than without sharding."""
    plain = _config(tiny_model_dir)
    parts = _parts(plain)
    unet = parts.components.denoiser
    whole = _bytes(_module_tensors(unet))
    blocks = [*unet.down_blocks, *unet.up_blocks, unet.mid_block]
    sizes = sorted((_bytes(_module_tensors(b)) for b in blocks), reverse=True)
    root = whole - sum(sizes)
    unsharded = weight_bytes(plain, parts, draws_samples=True, world_size=2)
    full = _config(tiny_model_dir, training={"fsdp": "full_shard"})
    grad_op = _config(tiny_model_dir, training={"fsdp": "shard_grad_op"})
    half = math.ceil(whole / 2)
    assert weight_bytes(full, parts, True, 2) == unsharded - whole + half + sizes[0] + sizes[1] + root
    assert weight_bytes(grad_op, parts, True, 2) == unsharded + half
    assert weight_bytes(full, parts, True, 1) == unsharded


# --- the check in a run ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 2)


def _count_steps(monkeypatch) -> list[int]:
    calls = []
    real = trainer_module.micro_batch_loss

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "micro_batch_loss", counted)
    return calls


@pytest.mark.integration
def test_an_estimate_above_the_device_stops_before_any_step(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    monkeypatch.setattr(memory_check, "device_memory", lambda device: (1024**2, 1024**2))
    steps = _count_steps(monkeypatch)
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, tmp_path / "o", max_train_steps=1
    )
    assert train(config) == 2
    # the other lines on stderr are transformers' loading bars
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1
    assert err[0].startswith("error: estimated peak memory ")
    assert "MiB exceeds the 1 MiB of cpu; lower train_batch_size or resolution" in err[0]
    assert err[0].endswith("or set ignore_memory_estimate = true to try anyway")
    assert steps == [] and not (tmp_path / "o" / "run.safetensors").exists()


@pytest.mark.integration
def test_ignore_memory_estimate_trains_anyway(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    monkeypatch.setattr(memory_check, "device_memory", lambda device: (1024**2, 1024**2))
    steps = _count_steps(monkeypatch)
    config = write_config(
        tmp_path / "c.toml",
        tiny_model_dir,
        images,
        tmp_path / "o",
        max_train_steps=1,
        ignore_memory_estimate=True,
    )
    assert train(config) == 0
    out = capsys.readouterr().out
    assert "trying anyway (ignore_memory_estimate = true)" in out
    assert steps and (tmp_path / "o" / "run.safetensors").exists()


@pytest.mark.integration
def test_the_plan_prints_the_estimate(tmp_path, tiny_model_dir, images, capsys):
    config = write_config(
        tmp_path / "c.toml",
        tiny_model_dir,
        images,
        tmp_path / "o",
        max_train_steps=1,
        train_batch_size=2,
    )
    assert train(config) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "memory:" in line]
    assert len(lines) == 1
    assert lines[0].startswith("  memory: about ")
    assert " peak on cpu (weights " in lines[0] and "activations " in lines[0]
    assert "at 64x64 x 2, interpreter + allocator " in lines[0] and "); the device has " in lines[0]


@pytest.mark.integration
def test_text_encoders_that_leave_fill_the_cache_first_and_train_the_same(
    tmp_path, tiny_model_dir, images, monkeypatch
):
    """A run whose text encoders leave the device (on a GPU: text_encoders_leave_device) fills
    the text cache before the denoiser comes, with the encoders brought for it alone, and trains
    what a run that keeps them writes."""
    from tests.integration.harness import tensors

    filled = []
    real = trainer_module.build_text_cache_alone

    def alone(*args):
        filled.append(args[2].denoiser.training)  # before _prepare: not yet in train mode
        return real(*args)

    monkeypatch.setattr(trainer_module, "build_text_cache_alone", alone)
    weights = {}
    for leave in (False, True):
        monkeypatch.setattr(trainer_module, "text_encoders_leave_device", lambda *a, v=leave: v)
        out = tmp_path / str(leave)
        config = write_config(tmp_path / f"{leave}.toml", tiny_model_dir, images, out,
                              max_train_steps=2, network_train_unet_only=True,
                              cache_text_encoder_outputs=True)  # fmt: skip
        assert train(config) == 0
        weights[leave] = tensors(out / "run.safetensors")
    assert filled == [False]
    assert weights[True].keys() == weights[False].keys()
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])
