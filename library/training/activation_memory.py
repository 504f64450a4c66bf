"""What a forward pass keeps for backward, measured on meta copies of the modules.

A meta copy has the module's structure with shape-only tensors, so a full SDXL UNet forward at
1024 px runs in seconds and allocates nothing; the real modules are not touched. Hooks add up
every leaf module's output, which is what autograd keeps for backward to a first approximation;
gradient checkpointing and autocast are imitated (see ActivationCounter). A forward pass
without gradients (the VAE's encoding) keeps nothing, but holds its intermediates for a moment:
LiveBytes follows them as they are made and freed.
"""

from __future__ import annotations

import copy
import itertools
import math
import weakref

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# CUDA's autocast runs normalisation in float32 whatever the mixed-precision dtype (the CPU's
# runs it in its input's dtype), and both run matrix products and convolutions in the
# mixed-precision dtype.
_FLOAT32_LAYERS = (torch.nn.GroupNorm, torch.nn.LayerNorm)
_AUTOCAST_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def _unsaved_outputs(module: torch.nn.Module) -> set[int]:
    """ids of the leaf layers whose outputs autograd does not keep: a LoRA layer's up
    projection (peft's ``lora_B``), whose output is only scaled and added to the base layer's
    output, which keeps neither; the down projection's output is kept (the up projection's
    input), and the sum is the next layer's input."""
    unsaved = set()
    for sub in module.modules():
        up = getattr(sub, "lora_B", None)
        if isinstance(up, torch.nn.ModuleDict):
            unsaved.update(id(m) for layer in up.values() for m in layer.modules())
    return unsaved


def meta_copy(module: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A copy of ``module`` whose parameters and buffers are meta tensors (shapes, no memory),
    floating ones in ``dtype``; ``module`` itself is not changed."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        memo[id(tensor)] = _meta_like(tensor, dtype)
    # tensors a module keeps as plain attributes (block swap's host weights) are not copied
    # either: deepcopy would duplicate them in host memory
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = _meta_like(value, dtype)
    return copy.deepcopy(module, memo)


def _weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """A leaf layer's floating weights: its parameters, or, for a layer that keeps them as
    plain tensor attributes (block swap's host weights), those."""
    params = [p for p in module.parameters() if p.is_floating_point()]
    if params:
        return params
    return [
        t for t in vars(module).values() if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]


def _meta_like(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    to = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    meta = torch.empty_like(tensor, device="meta", dtype=to)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
    return meta


def _bases(value: object) -> list[torch.Tensor]:
    """The tensors in ``value``, views replaced by the tensors they view."""
    return [t._base if t._base is not None else t for t in _tensors(value)]


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


class ActivationCounter:
    """Adds up what a forward pass keeps for backward, from hooks on (meta) modules.

    Every leaf module's output counts once. A gradient-checkpointed region (a diffusers block
    or transformers layer) keeps only its output during the forward; its inside is rebuilt,
    one region at a time, during the backward, so only the largest region's inside counts.
    ``autocast`` (the mixed-precision dtype, or None) mimics autocast: matrix products and
    convolutions run in that dtype, other layers with weights in their weights' dtype, and
    normalisation layers give float32 (CUDA's autocast; with ``float32_norms`` False the
    CPU's, which keeps their input's dtype). A LoRA up projection's output is not counted (it
    is only scaled and added); ``functions()`` counts the kept outputs no layer makes.
    ``plain_attention`` adds the attention-probability matrices that diffusers' plain
    attention keeps.
    """

    def __init__(
        self,
        autocast: torch.dtype | None = None,
        plain_attention: bool = False,
        float32_norms: bool = True,
    ):
        self.autocast = autocast
        self.plain_attention = plain_attention
        self.float32_norms = float32_norms
        self.outside = 0  # bytes kept outside checkpointed regions
        self.boundaries = 0  # bytes of the checkpointed regions' outputs
        self.regions: list[int] = []  # bytes inside each checkpointed region
        self._open: list[int] = []  # indexes of the regions running now, outermost first
        # id -> (tensor, region it was made in or None); holding the tensors keeps ids unique
        self._seen: dict[int, tuple[torch.Tensor, int | None]] = {}

    @property
    def total(self) -> int:
        return self.outside + self.boundaries + max(self.regions, default=0)

    def watch(self, module: torch.nn.Module) -> None:
        """Count the forward passes of ``module`` (hooks it, and its checkpointing)."""
        unsaved = _unsaved_outputs(module)
        for sub in module.modules():
            if getattr(sub, "_gradient_checkpointing_func", None) is not None:
                sub._gradient_checkpointing_func = self._checkpointed
            if self.plain_attention and isinstance(sub, Attention):
                sub.register_forward_pre_hook(self._attention_probs, with_kwargs=True)
            if next(sub.children(), None) is None:
                if self.autocast is not None and _weights(sub):
                    sub.register_forward_pre_hook(self._cast_inputs)
                if id(sub) not in unsaved:
                    sub.register_forward_hook(self._leaf_output)

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` where the forward pass is now (inside a region or outside)."""
        if self._open:
            self.regions[self._open[0]] += nbytes
        else:
            self.outside += nbytes

    def count(self, value: object) -> None:
        """Count the tensors in ``value`` not counted before (a view counts as its base)."""
        region = self._open[0] if self._open else None
        for tensor in _bases(value):
            if id(tensor) not in self._seen:
                self._seen[id(tensor)] = (tensor, region)
                self.add(tensor.numel() * tensor.element_size())

    def _boundary(self, value: object, region: int) -> None:
        """Count a region's output as kept: new tensors, and those made inside the region
        (counted there too, as the backward rebuilds them), but not the region's inputs."""
        for tensor in _bases(value):
            seen = self._seen.get(id(tensor))
            if seen is None or seen[1] == region:
                self._seen[id(tensor)] = (tensor, None)
                self.boundaries += tensor.numel() * tensor.element_size()

    def _leaf_output(self, module, inputs, output):
        if self.autocast and self.float32_norms and isinstance(module, _FLOAT32_LAYERS):
            output = output.float()
        self.count(output)
        return output

    def _cast_inputs(self, module, inputs):
        # autocast runs matrix products and convolutions in its dtype whatever the weight's
        # (a float32 adapter's too); other layers run in their weight's dtype
        lower = isinstance(module, _AUTOCAST_LAYERS)
        dtype = self.autocast if lower else _weights(module)[0].dtype
        return tuple(
            t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            for t in inputs
        )

    def _checkpointed(self, function, *args, **kwargs):
        if self._open:  # nested: part of the outer region
            return function(*args, **kwargs)
        region = len(self.regions)
        self.regions.append(0)
        self._open.append(region)
        try:
            output = function(*args, **kwargs)
        finally:
            self._open.pop()
        self._boundary(output, region)
        return output

    def functions(self) -> TorchFunctionMode:
        """A mode to run the forward pass in: it counts the outputs of the functions that make
        tensors autograd keeps outside any leaf layer (attention's output, which the output
        projection keeps as its input; concatenations, such as a UNet's skip connections)."""
        return _KeptFunctionOutputs(self)

    def _attention_probs(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        context = args[1] if len(args) > 1 else kwargs.get("encoder_hidden_states")
        queries = math.prod(hidden.shape[2:]) if hidden.dim() == 4 else hidden.shape[1]
        keys = queries if context is None else context.shape[1]
        # softmax keeps its float32 output; under autocast the matmul keeps a cast copy too
        per_element = 4 + (self.autocast.itemsize if self.autocast is not None else 0)
        self.add(hidden.shape[0] * module.heads * queries * keys * per_element)


def activation_bytes(
    module: torch.nn.Module,
    *args,
    autocast: torch.dtype | None = None,
    plain_attention: bool = False,
    **kwargs,
) -> int:
    """What ``module(*args, **kwargs)`` keeps for backward, counted on a meta copy (see
    ActivationCounter); floating inputs are taken to the meta device in the module's dtype."""
    dtype = autocast or next(module.parameters()).dtype
    copied = meta_copy(module, dtype)
    counter = ActivationCounter(autocast, plain_attention)
    counter.watch(copied)
    args = [_to_meta(a, dtype) for a in args]
    kwargs = {k: _to_meta(v, dtype) for k, v in kwargs.items()}
    with torch.enable_grad(), counter.functions():
        copied(*args, **kwargs)
    return counter.total


def _to_meta(value: object, dtype: torch.dtype) -> object:
    if not isinstance(value, torch.Tensor):
        return value
    return value.to("meta", dtype=dtype if value.is_floating_point() else value.dtype)


class LiveBytes(TorchDispatchMode):
    """The most bytes of tensors made inside it that are alive at once: every new tensor an
    operation returns counts until its Python object dies (a view counts with its base, an
    in-place result as the tensor it changed). For a forward pass without gradients, which
    frees each intermediate as soon as nothing refers to it, on meta tensors (shapes only).

    On meta tensors PyTorch's scaled-dot-product attention runs as plain products, whose
    attention matrices the fused kernels of a real device never make; enter ``FusedAttention``
    around it as well to count the output alone."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t) for t in _tensors(list(args) + list((kwargs or {}).values()))}
        for tensor in _tensors(out):
            if tensor._base is not None or id(tensor) in inputs:
                continue  # a view or an in-place result: its storage is counted already
            nbytes = tensor.numel() * tensor.element_size()
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(tensor, self._free, nbytes)
        return out

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes


class FusedAttention(TorchFunctionMode):
    """Scaled-dot-product attention as a fused kernel computes it, for counting memory on meta
    tensors: an output of the right shape, no attention matrix."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            query = args[0] if args else kwargs["query"]
            value = args[2] if len(args) > 2 else kwargs["value"]
            return query.new_empty((*query.shape[:-1], value.shape[-1]))
        return func(*args, **kwargs)


class _KeptFunctionOutputs(TorchFunctionMode):
    """See ActivationCounter.functions."""

    # attention's output (fused, or the product with the probabilities of plain attention),
    # and concatenations
    KEPT = (F.scaled_dot_product_attention, torch.bmm, torch.cat, torch.concat)

    def __init__(self, counter: ActivationCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.KEPT and torch.is_grad_enabled():
            self.counter.count(out)
        return out
