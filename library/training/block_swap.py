"""Block swap (kohya's ``blocks_to_swap``): the frozen weights of the transformer's last blocks
stay in host memory and come to the device only while a layer uses them.

Each frozen ``nn.Linear`` of a swapped block becomes a ``HostLinear``: its weight and bias move
to host memory (pinned where CUDA is used) and stop being parameters of the model, so moving the
model to the device, DistributedDataParallel and the saved state all leave them alone, and
DDP's start-up broadcast never sees them (every process reads the same files, so they are equal
everywhere). The forward pass copies a layer's weight to the device for that layer's product
only, and the backward pass copies it again to compute the gradient of the layer's input: the
weight gets no gradient (it is frozen), so nothing of it waits on the device between the two.
Adapters (LoRA) wrap these layers as they wrap any Linear and stay on the device, trained and
synchronised as usual.

The arithmetic is that of the layer it replaces: the same ``F.linear`` in the forward pass and
the same product in the backward pass, so a run with swapped blocks trains the same weights as
one without (tests/training/test_block_swap.py checks it on the CPU, where the copies are
no-ops). The price on a GPU is one host-to-device copy of each swapped weight per forward and
per backward pass, not overlapped with compute yet.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from library.models.float8 import FLOAT8, Float8Linear, compute_dtype
from library.models.quantized_base import STORED, QuantizedLinear

# the frozen Linears a swapped block's weights come from
SWAPPED = (nn.Linear, Float8Linear, QuantizedLinear)


class _StreamedLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` with the layer's weight and bias fetched from host memory
    in the forward pass, and the weight fetched again in the backward pass."""

    @staticmethod
    def forward(ctx, x, layer, dtype):
        weight, bias = layer.fetch(x.device, dtype)
        ctx.layer, ctx.dtype, ctx.x_dtype = layer, dtype, x.dtype
        return F.linear(x, weight, bias)  # under autocast, autocast casts as for nn.Linear

    @staticmethod
    def backward(ctx, grad_output):
        weight, _ = ctx.layer.fetch(grad_output.device, ctx.dtype, with_bias=False)
        grad_x = grad_output @ weight.to(grad_output.dtype)
        return grad_x.to(ctx.x_dtype), None, None


class HostLinear(nn.Linear):
    """A frozen Linear whose weight and bias live in host memory (see the module docstring).
    A float8-stored weight (fp8_base) is used in the autocast dtype, or outside autocast in
    ``compute_dtype``, as Float8Linear does. ``weight`` and ``bias`` read the host tensors
    (for their shapes and dtypes; using them on the device is an error, as it should be)."""

    def __init__(self, layer: nn.Linear):
        nn.Module.__init__(self)  # not nn.Linear's: it would make parameters on the device
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.compute_dtype = getattr(layer, "compute_dtype", None)
        pin = torch.cuda.is_available()

        def host(tensor):
            if tensor is None:
                return None
            if tensor.is_meta:  # a shapes-only model (the dry run's) has no data to move
                return tensor.detach()  # a plain tensor, or setattr would make it a parameter
            tensor = tensor.detach().to("cpu")
            return tensor.pin_memory() if pin else tensor

        # plain attributes, not parameters: .to(device), DDP and state_dict pass them by
        self.host_bias = host(layer.bias)
        # a quantized layer (base_model_precision) keeps its stored form, in host memory; a
        # tuple, so that it is no submodule the model's moves would take to the device
        self.quantized: tuple[QuantizedLinear, ...] = ()
        if isinstance(layer, QuantizedLinear):
            layer.bias = None  # the bias is the HostLinear's
            for name in STORED:
                setattr(layer, name, host(getattr(layer, name)))
            self.quantized, self.host_weight = (layer,), layer.q_data
        else:
            self.host_weight = host(layer.weight)

    @property
    def weight(self) -> torch.Tensor:
        return self.host_weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.host_bias

    def host_bytes(self) -> int:
        """Bytes this layer keeps in host memory: its weight as stored (a quantized layer's
        stored form) and its bias."""
        if self.quantized:
            weight = self.quantized[0].stored_bytes()
        else:
            weight = self.host_weight.numel() * self.host_weight.element_size()
        bias = self.host_bias
        return weight + (0 if bias is None else bias.numel() * bias.element_size())

    def fetch(self, device: torch.device, dtype: torch.dtype | None, with_bias: bool = True):
        """The weight (and bias) on ``device``, cast to ``dtype`` when given (a quantized
        weight: dequantized there into ``dtype``)."""
        if self.quantized:
            weight = self.quantized[0].dequantized(dtype, device)
        else:
            weight = self.host_weight.to(device, non_blocking=True)
        bias = None
        if with_bias and self.host_bias is not None:
            bias = self.host_bias.to(device, non_blocking=True)
        if dtype is not None:
            weight, bias = weight.to(dtype), None if bias is None else bias.to(dtype)
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = None
        if self.quantized or self.host_weight.dtype == FLOAT8:  # as Float8Linear.forward
            dtype = compute_dtype(x, self.compute_dtype)
            x = x.to(dtype)
        return _StreamedLinear.apply(x, self, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, in host memory"


def swap_linears(blocks: list[nn.Module]) -> int:
    """Turn every frozen Linear of ``blocks`` (plain, float8-stored, quantized, or the base
    layer an adapter wraps) into a HostLinear; returns how many."""
    count = 0
    for block in blocks:
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if type(child) not in SWAPPED or child.weight.requires_grad:
                    continue
                setattr(parent, name, HostLinear(child))
                count += 1
    return count
