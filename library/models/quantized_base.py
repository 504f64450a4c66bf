"""Frozen Linear weights stored in 4 or 8 bits (base_model_precision), as QLoRA trains.

Every frozen ``nn.Linear`` of the denoiser becomes a ``QuantizedLinear``: its weight is quantized
once by bitsandbytes' own functions and kept only in that form, and every use dequantizes it into
the compute dtype (the autocast dtype inside autocast, else ``compute_dtype``) for that one
product:

- ``nf4``: QLoRA's 4-bit NormalFloat, blocks of 64 values sharing one absmax
  (``bitsandbytes.functional.quantize_4bit``), about 0.56 bytes per weight; with
  ``bnb_4bit_use_double_quant`` the absmaxes are themselves quantized to 8 bits (about 0.52);
- ``int8``: each output row scaled by its absmax to int8 (``int8_vectorwise_quant``, the weight
  half of LLM.int8()), about 1 byte per weight plus 4 per row.

The backward pass dequantizes again to carry the gradient to the layer's input, so no
dequantized weight waits for it (``_DequantizedLinear``); the weight itself gets no gradient.
Adapters (LoRA, LyCORIS) wrap these layers as any Linear and train in their own dtype, so a
file written from such a run holds ordinary adapter weights for the full-precision base: the
quantization error is never baked into them. The stored form is plain tensor attributes, not
parameters or buffers: moving the model moves them (``_apply``), while a dtype cast, DDP's
start-up broadcast, gradient reduction and the saved state leave them alone (every process
quantizes the same weights the same way).

bitsandbytes' functions run on the CPU and on CUDA alike; the arithmetic of the product is the
compute dtype's, never 4- or 8-bit.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from library.models.float8 import compute_dtype

Precision = Literal["nf4", "int8"]
BLOCKSIZE = 64  # QLoRA's block of weights per absmax

# base_model_precision (SimpleTuner's key and words) -> the storage
PRECISIONS: dict[str, Precision | None] = {"no_change": None, "nf4-bnb": "nf4", "int8-bnb": "int8"}
# the tensor attributes of a stored weight (absmax: per block for nf4, per row for int8)
STORED = ("q_data", "q_absmax", "q_code", "q_offset", "q_nested_absmax", "q_nested_code")


class _DequantizedLinear(torch.autograd.Function):
    """``F.linear(x, W, bias)`` with W dequantized in the forward pass and again in the
    backward pass (for the input's gradient), so that only the stored form stays alive."""

    @staticmethod
    def forward(ctx, x, layer, dtype):
        ctx.layer, ctx.dtype, ctx.x_dtype = layer, dtype, x.dtype
        bias = layer.bias.to(dtype) if layer.bias is not None else None
        return F.linear(x.to(dtype), layer.dequantized(dtype), bias)

    @staticmethod
    def backward(ctx, grad_output):
        weight = ctx.layer.dequantized(ctx.dtype)
        grad_x = grad_output.to(ctx.dtype) @ weight
        return grad_x.to(ctx.x_dtype), None, None


class QuantizedLinear(nn.Linear):
    """A frozen Linear whose weight is stored in nf4 or int8 (see the module docstring)."""

    compute_dtype: torch.dtype
    precision: Precision

    def __init__(self, layer: nn.Linear, precision: Precision, double_quant: bool,
                 compute_dtype: torch.dtype):  # fmt: skip
        nn.Module.__init__(self)  # not nn.Linear's: it would make a weight parameter
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.bias = layer.bias
        self.precision, self.compute_dtype = precision, compute_dtype
        weight = layer.weight.detach()
        self.q_shape, self.q_dtype = tuple(weight.shape), weight.dtype
        # nf4 blocks run over the flattened weight, so the shape it is quantized in changes
        # nothing stored; pairs of columns keep bitsandbytes' CPU kernel, which takes even rows
        # only (an odd last side goes to a torch.compile fallback)
        count = weight.numel()
        self.q_grid = (count // 2, 2) if count % 2 == 0 else self.q_shape
        self.q_absmax = self.q_code = self.q_offset = None
        self.q_nested_absmax = self.q_nested_code = None
        if weight.is_meta:  # a shapes-only model (the dry run's): the stored form's shapes
            self._meta_storage(double_quant)
        elif precision == "nf4":
            self._store_nf4(weight, double_quant)
        else:
            self._store_int8(weight)

    def _store_nf4(self, weight: torch.Tensor, double_quant: bool) -> None:
        from bitsandbytes.functional import quantize_4bit

        # bitsandbytes quantizes float32, float16 and bfloat16
        source = weight if weight.dtype in (torch.float16, torch.bfloat16) else weight.float()
        source = source.reshape(self.q_grid)
        data, state = quantize_4bit(source, blocksize=BLOCKSIZE, compress_statistics=double_quant,
                                    quant_type="nf4")  # fmt: skip
        self.q_data, self.q_absmax, self.q_code = data, state.absmax, state.code
        if state.nested:
            self.q_offset = state.offset
            self.q_nested_absmax, self.q_nested_code = state.state2.absmax, state.state2.code

    def _store_int8(self, weight: torch.Tensor) -> None:
        from bitsandbytes.functional import int8_vectorwise_quant

        self.q_data, self.q_absmax, _ = int8_vectorwise_quant(weight.float())

    def _meta_storage(self, double_quant: bool) -> None:
        count = self.in_features * self.out_features
        if self.precision == "int8":
            self.q_data = torch.empty(self.q_shape, dtype=torch.int8, device="meta")
            self.q_absmax = torch.empty(self.out_features, device="meta")
            return
        blocks = -(-count // BLOCKSIZE)
        self.q_data = torch.empty((count + 1) // 2, 1, dtype=torch.uint8, device="meta")
        self.q_code = torch.empty(16, device="meta")
        if double_quant:
            self.q_absmax = torch.empty(blocks, dtype=torch.uint8, device="meta")
            self.q_offset = torch.empty((), device="meta")
            self.q_nested_absmax = torch.empty(-(-blocks // 256), device="meta")
            self.q_nested_code = torch.empty(256, device="meta")
        else:
            self.q_absmax = torch.empty(blocks, device="meta")

    def stored(self) -> list[torch.Tensor]:
        """The tensors of the stored weight."""
        return [t for t in (getattr(self, n) for n in STORED) if t is not None]

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored())

    @property
    def weight(self) -> torch.Tensor:
        """The weight dequantized into ``compute_dtype``: a fresh tensor on the stored form's
        device, for whoever asks for a Linear's weight (its shape, device, or values, as
        DoRA's norms); the layer's own products never read it."""
        return self.dequantized(self.compute_dtype)

    def dequantized(self, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
        """The weight in ``dtype`` on ``device`` (None: the stored form's device; block swap's
        layers keep the stored form in host memory and dequantize on the GPU)."""
        if self.q_data.is_meta:
            return torch.empty(self.q_shape, dtype=dtype, device="meta")
        stored = {name: getattr(self, name) for name in STORED}
        if device is not None:
            stored = {k: None if v is None else v.to(device, non_blocking=True)
                      for k, v in stored.items()}  # fmt: skip
        if self.precision == "int8":
            scale = stored["q_absmax"].to(torch.float32).unsqueeze(1) / 127.0
            # scaled in place: one float32 copy of the weight at a time, then the cast
            return stored["q_data"].to(torch.float32).mul_(scale).to(dtype)
        from bitsandbytes.functional import dequantize_4bit

        weight = dequantize_4bit(stored["q_data"], self._quant_state(stored))
        return weight.reshape(self.q_shape).to(dtype)

    def _quant_state(self, stored: dict):
        """bitsandbytes' QuantState of an nf4 weight from its ``stored`` tensors."""
        from bitsandbytes.functional import QuantState

        nested = None
        if stored["q_nested_absmax"] is not None:
            nested = QuantState(
                absmax=stored["q_nested_absmax"], code=stored["q_nested_code"], blocksize=256,
                dtype=torch.float32,
            )  # fmt: skip
        return QuantState(
            absmax=stored["q_absmax"], shape=torch.Size(self.q_grid), code=stored["q_code"],
            blocksize=BLOCKSIZE, quant_type="nf4", dtype=self.q_dtype,
            offset=stored["q_offset"], state2=nested,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _DequantizedLinear.apply(x, self, compute_dtype(x, self.compute_dtype))

    def _apply(self, fn, recurse=True):
        # the stored form follows device moves only: a dtype cast would break its encoding
        super()._apply(fn, recurse)
        probe = fn(torch.empty(0, device=self.q_data.device))
        for name in STORED:
            value = getattr(self, name)
            if value is not None and value.device != probe.device:
                setattr(self, name, value.to(probe.device))
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.precision}"


def quantize_linears(
    module: nn.Module, precision: Precision, double_quant: bool, compute_dtype: torch.dtype
) -> int:
    """Turn every frozen plain ``nn.Linear`` below ``module`` into a QuantizedLinear; returns how
    many. Trained Linears are left alone (only frozen weights may lose precision), and so are
    those of fewer weights than one quantization block (a 12-to-1 projection: nothing to save,
    and bitsandbytes compiles a kernel for such a shape on the CPU)."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child.weight.requires_grad:
                continue
            if child.weight.numel() < BLOCKSIZE:
                continue
            setattr(parent, name, QuantizedLinear(child, precision, double_quant, compute_dtype))
            count += 1
    return count
