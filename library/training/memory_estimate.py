"""A rough estimate of one optimizer step's peak memory on the training device.

Made after the models are loaded and the trained parameters are known, before anything moves to
the device, so a run that cannot fit stops in seconds instead of being killed mid-way (the check:
library/training/memory_check.py). Counted:

- weights: every model on the device (parameters and buffers at their dtype), plus autocast's
  half-precision copies of float32 trained weights under mixed precision;
- trained state: gradients (in the trained weights' dtype; a second copy in DDP's buckets under
  several processes), the optimizer state by ``optimizer_type`` (a small table), the EMA copy;
- with fsdp_text_encoder over N processes (library/training/text_sharding.py): the text
  encoders' share while they fill the cache, 1/N of their weights, plus the root and the two
  layers gathered at once;
- with fsdp over N processes (library/training/sharding.py): the denoiser's weights, and its
  trained parameters' gradients, optimizer state and EMA, at 1/N each, plus what is gathered at
  once: two blocks under "full_shard" (the one computing and the next, fetched ahead), the
  whole denoiser under "shard_grad_op" (every block stays gathered from its forward pass to its
  backward pass), and the whole gradients while an accumulation window adds them up;
- activations: one micro-batch at the largest training size, measured by running the trained
  path (text encoders when trained, then the UNet) on *meta* copies of the models (shapes only,
  no memory, the real modules untouched: meta_activations.py) and adding up every leaf module's
  output. That is what autograd keeps for backward to a first approximation; with gradient
  checkpointing only the checkpointed regions' outputs and the largest region's inside are
  kept, and with cpu_offload_checkpointing the regions' outputs wait in host memory instead;
- the optimizer's update: what it allocates while it runs (torch's foreach AdamW: a temporary
  the size of a parameter group). It runs after the backward pass has freed the activations,
  so the larger of the two counts;
- the VAE's encoding, which holds its intermediates for a moment (followed on a meta copy by
  LiveBytes): while the latent cache is built (the VAE on the device, nothing trained yet), or
  in every step beside the trained state when latents are not cached. The peak is the larger
  of that moment and the step's.

On the CPU, host memory is the device's: the VAE moved "off the device" and the weights block
swap keeps in host memory count too. Beyond the tensors, the process itself holds memory on the
device (library/training/process_memory.py): the interpreter and its libraries on the CPU, the
CUDA context on a GPU, and what the allocator keeps after the step's transient memory is freed;
the estimate is of the process's peak, which is what runs out. Not counted: sampling and
validation (no gradients; the VAE's decoding of sample images) and the kernels' workspaces.
bench/memory_accuracy.py measures the estimate against real steps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from library.config.schema import Config
from library.data.captions import CaptionOptions
from library.data.plan import DataStats
from library.models.quantized_base import QuantizedLinear
from library.training.block_swap import HostLinear
from library.training.experts import experts_on_device, offloads
from library.training.meta_activations import (
    TrainingSize,
    encoding_bytes,
    training_activations,
)
from library.training.optimizers import optimizer_kwargs
from library.training.process_memory import process_bytes
from library.training.setup import WEIGHT_DTYPES, TrainedParts, trained_dtype
from library.training.sharding import shard_units, sharded_weight_bytes
from library.training.text_sharding import shards_text_encoders, text_caching_bytes

# optimizer_type -> (state tensors per parameter, bits per element: None = the parameter's dtype)
OPTIMIZER_STATES: dict[str, tuple[int, int | None]] = {
    "AdamW": (2, None),
    "AdamW8bit": (2, 8),
    "PagedAdamW": (2, 32),
    "PagedAdamW8bit": (2, 8),
    "PagedAdamW32bit": (2, 32),
    "Lion": (1, None),
    "Lion8bit": (1, 8),
    "PagedLion8bit": (1, 8),
    "SGDNesterov": (1, None),
    "SGDNesterov8bit": (1, 8),
    "Prodigy": (4, None),  # exp_avg, exp_avg_sq, s and the starting point p0
    "AdamWScheduleFree": (2, None),
    "RAdamScheduleFree": (2, None),
    "SGDScheduleFree": (1, None),
}
UNKNOWN_OPTIMIZER_STATES = (2, None)  # an optimizer by import path: assume Adam-like
# bitsandbytes keeps 32-bit state for tensors smaller than this (its min_8bit_size default)
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCK = 256  # elements per float32 scale of bitsandbytes' blockwise 8-bit state


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one optimizer step's peak, by kind."""

    weights: int
    trained_state: int  # gradients, optimizer state, EMA
    activations: int
    size: TrainingSize
    checkpointing: bool
    offloaded: bool = False  # cpu_offload_checkpointing: the regions' outputs are on the host
    update: int = 0  # what the optimizer's update allocates for a moment
    encoding: int = 0  # above ``weights`` while the VAE encodes images (caching, or each step)
    process: int = 0  # the process's own memory beyond its tensors (process_memory.py)
    # the text encoders alone on the device while they fill the text cache, before anything
    # else comes (text_encoders_leave_device); 0 when they stay with the other weights
    text_caching: int = 0

    @property
    def step(self) -> int:
        """Above ``weights`` at the step's peak; the update runs after the backward pass has
        freed the activations."""
        return self.trained_state + max(self.activations, self.update)

    @property
    def tensors(self) -> int:
        """The most tensor memory alive at once."""
        return max(self.weights + max(self.step, self.encoding), self.text_caching)

    @property
    def total(self) -> int:
        """The process's peak: its tensors and its own memory."""
        return self.tensors + self.process


# --- weights and trained state ------------------------------------------------------------------


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each counted once."""
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers at their dtypes, and of the weights its
    quantized layers store (base_model_precision)."""
    stored = sum(m.stored_bytes() for m in module.modules() if isinstance(m, QuantizedLinear))
    return tensor_bytes(itertools.chain(module.parameters(), module.buffers())) + stored


def dequantized_bytes(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """The largest weight a layer of ``module`` makes for one product (one layer's at a time,
    forward and backward): a quantized layer's dequantized in ``dtype`` (int8: through a
    float32 copy), a swapped layer's copy fetched from host memory in its stored dtype and cast
    to ``dtype``."""
    sizes = [0]
    for m in module.modules():
        if isinstance(m, QuantizedLinear):
            # int8 is scaled in float32 before the cast (QuantizedLinear.dequantized)
            scaled = 4 if m.precision == "int8" and dtype != torch.float32 else 0
            sizes.append(m.in_features * m.out_features * (scaled + dtype.itemsize))
        elif isinstance(m, HostLinear):
            stored = 0 if m.quantized else m.host_weight.element_size()
            sizes.append(m.in_features * m.out_features * (stored + dtype.itemsize))
    return max(sizes)


def host_bytes(module: torch.nn.Module) -> int:
    """Bytes block swap keeps in host memory for ``module``'s swapped layers."""
    return sum(m.host_bytes() for m in module.modules() if isinstance(m, HostLinear))


def text_encoders_leave_device(
    config: Config,
    parts: TrainedParts,
    draws_samples: bool,
    device_type: str = "cuda",
    world_size: int = 1,
) -> bool:
    """The frozen text encoders are needed only to fill the text cache, so the trainer fills it
    before the denoiser comes to the device and then moves them off: their outputs are cached,
    none trains, every caption is fixed before training (no caption option varies it), the
    family reads no reference images with its text, and no sample image is drawn (its prompts
    would be encoded) unless the encoders are sharded over the ``world_size`` processes
    (fsdp_text_encoder: the sample prompts are encoded during the fill). On the CPU, host
    memory is the device's, so they stay."""
    family = parts.components.family
    fixed = all(
        not CaptionOptions.from_subset(subset).is_random
        for dataset in config.datasets
        for subset in dataset.subsets
    )
    return (
        device_type != "cpu"
        and config.data.text_cached
        and not parts.train_text_encoder
        and fixed
        and not family.text_reads_references
        and (not draws_samples or shards_text_encoders(config, world_size))
    )


def vae_stays_on_device(config: Config, draws_samples: bool, device_type: str = "cuda") -> bool:
    """The trainer moves the VAE off the device when every latent is cached and no sample
    image is decoded; on the CPU, host memory is the device's, so it stays."""
    return device_type == "cpu" or not config.data.latents_cached or draws_samples


def sharding(config: Config, world_size: int) -> str | None:
    """The fsdp mode this run shards the denoiser with, or None."""
    mode = config.training.fsdp
    return mode if mode != "no" and world_size > 1 else None


def denoiser_weight_bytes(config: Config, denoiser: torch.nn.Module, world_size: int) -> int:
    """The denoiser's weights on one device at the step's peak (see the module docstring)."""
    whole = module_bytes(denoiser)
    mode = sharding(config, world_size)
    if mode is None:
        return whole
    if mode == "full_shard":
        units = [module_bytes(u) for u in shard_units(denoiser)]
        return sharded_weight_bytes(whole, units, world_size)
    return math.ceil(whole / world_size) + whole  # every block stays gathered


def weight_bytes(
    config: Config,
    parts: TrainedParts,
    draws_samples: bool,
    world_size: int = 1,
    device_type: str = "cuda",
) -> int:
    """Every model kept on the device during training, plus autocast's copies of trained
    float32 weights in the mixed-precision dtype (kept for backward). On the CPU the weights
    block swap keeps in host memory are on the device too."""
    comps = parts.components
    leave = text_encoders_leave_device(config, parts, draws_samples, device_type, world_size)
    modules = [] if leave else [*comps.text_encoders]
    if vae_stays_on_device(config, draws_samples, device_type):
        modules.append(comps.vae)
    if comps.image_encoder is not None:  # on the device with the VAE (its states: every step)
        modules.append(comps.image_encoder.model)
    total = sum(module_bytes(m) for m in modules)
    total += denoiser_weight_bytes(config, comps.denoiser, world_size)
    total += _other_experts_bytes(config, comps)
    if device_type == "cpu":
        total += host_bytes(comps.denoiser)
    compute = WEIGHT_DTYPES[config.training.mixed_precision]
    total += dequantized_bytes(comps.denoiser, compute)
    params = parts.parameters()
    if compute != torch.float32 and trained_dtype(config) == torch.float32:
        total += sum(p.numel() for p in params) * compute.itemsize
    return total


def _other_experts_bytes(config: Config, comps) -> int:
    """The trained denoiser experts' weights on the device beside ``comps.denoiser``'s: whole,
    or only their trained ones when the inactive expert's frozen weights wait in host memory
    (offload_inactive_dit)."""
    if comps.experts is None:
        return 0
    others = [m for m in experts_on_device(config, comps.experts) if m is not comps.denoiser]
    if offloads(config, comps.experts):
        return sum(tensor_bytes([p for p in m.parameters() if p.requires_grad]) for m in others)
    return sum(module_bytes(m) for m in others)


def gradient_bytes(params: list[torch.nn.Parameter], world_size: int, bucket_view: bool) -> int:
    """Gradients in the parameters' dtype; DDP's buckets hold a second copy unless gradients
    are views into them."""
    grads = tensor_bytes(params)
    return grads * 2 if world_size > 1 and not bucket_view else grads


def optimizer_state_bytes(
    optimizer_type: str, params: list[torch.nn.Parameter], kwargs: dict
) -> int:
    """About how much state ``optimizer_type`` keeps for ``params`` (``kwargs``: its
    optimizer_args)."""
    if optimizer_type == "Adafactor":
        return sum(_adafactor_elements(p, kwargs) * p.element_size() for p in params)
    states, bits = OPTIMIZER_STATES.get(optimizer_type, UNKNOWN_OPTIMIZER_STATES)
    if optimizer_type == "AdamW" and kwargs.get("amsgrad"):
        states += 1
    min_8bit = kwargs.get("min_8bit_size", BNB_MIN_8BIT_SIZE)
    return sum(states * _state_bytes(p, bits, min_8bit) for p in params)


def _state_bytes(param: torch.Tensor, bits: int | None, min_8bit: int) -> int:
    """Bytes of one state tensor of ``param``: in its dtype, 32-bit, or bitsandbytes' 8-bit
    (one byte per element plus a float32 scale per block; 32-bit below ``min_8bit``)."""
    if bits is None:
        return param.numel() * param.element_size()
    if bits == 32 or param.numel() < min_8bit:
        return param.numel() * 4
    return param.numel() + math.ceil(param.numel() / BNB_BLOCK) * 4


def _adafactor_elements(param: torch.Tensor, kwargs: dict) -> int:
    """Adafactor's state elements: a factored second moment (rows + columns) for matrices, a
    full one otherwise, and a first moment with beta1."""
    shape = param.shape
    if len(shape) >= 2:
        second = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    else:
        second = param.numel()
    first = param.numel() if kwargs.get("beta1") is not None else 0
    return second + first


def trained_state_bytes(config: Config, parts: TrainedParts, world_size: int) -> int:
    """Gradients, optimizer state and the EMA copy (float32) of the trained parameters; with
    fsdp, the denoiser's share of them sharded (see the module docstring)."""
    params = parts.parameters()
    training = config.training
    in_denoiser = {id(p) for p in parts.components.denoiser.parameters()}
    shards = world_size if sharding(config, world_size) else 1
    sharded = [p for p in params if id(p) in in_denoiser] if shards > 1 else []
    whole = [p for p in params if id(p) not in {id(q) for q in sharded}]
    total = gradient_bytes(whole, world_size, training.ddp_gradient_as_bucket_view)
    kwargs = optimizer_kwargs(config.optimizer)
    total += optimizer_state_bytes(config.optimizer.optimizer_type, whole, kwargs)
    if training.ema_decay:
        total += sum(p.numel() for p in whole) * 4
    if sharded:
        own = optimizer_state_bytes(config.optimizer.optimizer_type, sharded, kwargs)
        own += tensor_bytes(sharded)  # the gradient slices
        if training.ema_decay:
            own += sum(p.numel() for p in sharded) * 4
        total += math.ceil(own / shards)
        if training.gradient_accumulation_steps > 1:  # whole gradients between reductions
            total += tensor_bytes(sharded)
    return total


def update_bytes(config: Config, parts: TrainedParts, device_type: str, world_size: int) -> int:
    """What the optimizer's update allocates while it runs. torch's AdamW with ``foreach`` (its
    default on CUDA) computes the update's denominator for a whole parameter group at once: a
    temporary of the group's size; without it, one parameter at a time (its square root and
    denominator while the previous parameter's denominator is still held: three times the
    largest parameter bounds it); ``fused`` allocates none. The other optimizers update in
    place or per parameter, too little to count."""
    if config.optimizer.optimizer_type != "AdamW":
        return 0
    kwargs = optimizer_kwargs(config.optimizer)
    if kwargs.get("fused"):
        return 0
    groups = [tensor_bytes(group["params"]) for group in parts.param_groups]
    if kwargs.get("foreach", device_type == "cuda"):
        shards = world_size if sharding(config, world_size) else 1
        return math.ceil(max(groups, default=0) / shards)
    return 3 * max((tensor_bytes([p]) for p in parts.parameters()), default=0)


def _encoding(config: Config, parts: TrainedParts, size: TrainingSize, trained_state: int,
              draws_samples: bool, device_type: str) -> tuple[int, int]:  # fmt: skip
    """Above the weights while the VAE encodes, and of that the encoding's own intermediates:
    with cached latents, at caching, before the optimizer holds anything (the VAE back on the
    device if training moves it off); without, in every step, beside the trained state."""
    if not config.data.latents_cached:
        encode = encoding_bytes(parts, size, size.batch)
        return trained_state + encode, encode
    encode = encoding_bytes(parts, size, config.data.vae_batch_size)
    if vae_stays_on_device(config, draws_samples, device_type):
        return encode, encode
    return encode + module_bytes(parts.components.vae), encode


def training_sizes(stats: DataStats) -> list[TrainingSize]:
    """Each dataset's largest bucket at its batch size (each size once), its reference images'
    pixels counted with its own (edit models) and a clip's pixels over its frames."""
    sizes = []
    for ds in stats.datasets:
        buckets = [(b.size, b.references, b.frames) for b in ds.buckets]
        (width, height), references, frames = max(buckets or [(ds.resolution, (), 1)], key=_pixels)
        size = TrainingSize(width, height, ds.batch_size, references, frames)
        if size not in sizes:
            sizes.append(size)
    return sizes


def _pixels(bucket: tuple) -> int:
    (width, height), references, frames = bucket
    return width * height * frames + sum(w * h for w, h in references)


def estimate_peak_memory(
    config: Config,
    parts: TrainedParts,
    stats: DataStats,
    world_size: int,
    draws_samples: bool,
    device_type: str = "cuda",
) -> MemoryEstimate:
    """The estimate for this run on a device of ``device_type`` (see the module docstring);
    activations at the size of the datasets that needs most."""
    # on the CPU, host memory is the device's: offloading moves nothing out of it
    offloaded = config.training.cpu_offload_checkpointing and device_type != "cpu"
    measured = [
        (training_activations(config, parts, s, offloaded, device_type), s)
        for s in training_sizes(stats)
    ]
    activations, size = max(measured, key=lambda pair: pair[0])
    trained_state = trained_state_bytes(config, parts, world_size)
    encoding, encode = max(
        _encoding(config, parts, s, trained_state, draws_samples, device_type)
        for s in training_sizes(stats)
    )
    update = update_bytes(config, parts, device_type, world_size)
    # the transient memory at the peak: the step's, or the encoding's where it holds more
    step = trained_state + max(activations, update)
    transient = max(activations, update) if step >= encoding else encode
    return MemoryEstimate(
        weights=weight_bytes(config, parts, draws_samples, world_size, device_type),
        trained_state=trained_state,
        activations=activations,
        size=size,
        checkpointing=config.training.gradient_checkpointing,
        offloaded=offloaded,
        update=update,
        encoding=encoding,
        process=process_bytes(device_type, transient),
        text_caching=_text_caching(config, parts, draws_samples, device_type, world_size),
    )


def _text_caching(
    config: Config, parts: TrainedParts, draws_samples: bool, device_type: str, world_size: int
) -> int:
    """The text encoders' weights while they fill the cache alone (their forward keeps no
    activations: nothing trains); 0 when they stay beside the denoiser. Sharded over the
    processes (fsdp_text_encoder), each holds its share and the units gathered at once."""
    if not text_encoders_leave_device(config, parts, draws_samples, device_type, world_size):
        return 0
    encoders = parts.components.text_encoders
    if shards_text_encoders(config, world_size):
        return sum(text_caching_bytes(m, world_size, module_bytes) for m in encoders)
    return sum(module_bytes(m) for m in encoders)
