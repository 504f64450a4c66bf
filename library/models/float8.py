"""Frozen Linear weights stored in float8 and computed in the training precision (fp8_base).

kohya's ``fp8_base`` keeps the frozen base model's weights in float8 (e4m3: 1 byte instead of 2)
and computes with them in the mixed-precision dtype. Here every frozen ``nn.Linear`` of a module
becomes a ``Float8Linear``: its weight is rounded to float8 once, and each forward casts it back
to the compute dtype (the autocast dtype inside autocast, else the layer's ``compute_dtype``), so
the arithmetic never runs in float8 (the CPU has no float8 kernels). The backward pass casts it
again for the input's gradient rather than keeping each layer's cast copy until then, which
would hold a compute-dtype copy of every weight at the peak without gradient checkpointing. Biases, norms, embeddings and
convolutions keep their dtype. LoRA adapters wrap these layers like any Linear; peft creates them
in ``compute_dtype``, as it would for a base model in that dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FLOAT8 = torch.float8_e4m3fn


class _Float8Product(torch.autograd.Function):
    """``F.linear(x, W, bias)`` with the float8 W cast to the compute dtype in the forward pass
    and cast again in the backward pass (for the input's gradient): autograd keeps the float8
    weight, which exists anyway, instead of a compute-dtype copy of every layer's weight."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        ctx.save_for_backward(weight)
        ctx.dtype, ctx.x_dtype = dtype, x.dtype
        bias = bias.to(dtype) if bias is not None else None
        return F.linear(x.to(dtype), weight.to(dtype), bias)

    @staticmethod
    def backward(ctx, grad_output):
        (weight,) = ctx.saved_tensors
        grad_x = grad_output.to(ctx.dtype) @ weight.to(ctx.dtype)
        return grad_x.to(ctx.x_dtype), None, None, None


class Float8Linear(nn.Linear):
    """A frozen Linear whose weight is stored in float8 and used in the compute dtype."""

    compute_dtype: torch.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Float8Product.apply(x, self.weight, self.bias, compute_dtype(x, self.compute_dtype))


def compute_dtype(x: torch.Tensor, fallback: torch.dtype) -> torch.dtype:
    """The dtype a layer with a stored (float8 or quantized) weight computes ``x`` in: the
    autocast dtype inside autocast, else ``fallback`` (the layer's compute dtype)."""
    device = x.device.type
    # meta: the memory estimate's shapes-only pass, which has no autocast of its own
    if device != "meta" and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return fallback


# Layers whose weight dtype their parent reads to cast its input: transformers' T5 feed-forward
# casts its hidden states to ``wo.weight.dtype``, which would round activations to float8.
KEPT_SUFFIXES = (".DenseReluDense.wo",)


def store_in_float8(module: nn.Module, compute_dtype: torch.dtype) -> int:
    """Turn every frozen ``nn.Linear`` below ``module`` into a Float8Linear computing in
    ``compute_dtype``; returns how many. Trained Linears are left alone (float8 is for weights
    that never change), and so are the few layers whose dtype their model reads."""
    count = 0
    for path, layer in module.named_modules():
        if type(layer) is not nn.Linear or layer.weight.requires_grad:
            continue
        if path.endswith(KEPT_SUFFIXES):
            continue
        layer.weight.data = layer.weight.data.to(FLOAT8)
        layer.__class__ = Float8Linear
        layer.compute_dtype = compute_dtype
        count += 1
    return count


def keep_out_of_ddp(module: nn.Module) -> list[str]:
    """Tell DistributedDataParallel to leave ``module``'s float8 weights alone; returns their
    names. They are frozen and equal on every process (read from the same files), and DDP's
    start-up broadcast of parameters cannot carry float8 on every backend (gloo refuses it).
    Call after adapters are injected (they rename the wrapped layers' weights)."""
    names = [n for n, p in module.named_parameters() if p.dtype == FLOAT8]
    if names:
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            module, names
        )
    return names
