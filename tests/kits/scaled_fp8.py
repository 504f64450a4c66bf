"""ComfyUI's scaled fp8 files made from a state dict, as ComfyUI's converters lay them out, with
the weights they stand for computed here (the reference a reader must give back).

Each chosen matrix is quantized with one absmax scale: ``q = (w / s)`` in float8 with
``s = max|w| / max(float8)``; its weight is then ``q.float() * s``. The other tensors stay as
they are (ComfyUI leaves norms, biases and embeddings in bf16).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import torch

FORMATS = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def quantize(weight: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float8 tensor, its float32 scale of shape []) of ``weight``."""
    scale = weight.detach().float().abs().max() / torch.finfo(fp8).max
    return (weight.detach().float() / scale).to(fp8), scale.reshape(())


def description(fmt: str) -> torch.Tensor:
    """A layer's ``comfy_quant`` tensor: its JSON description in UTF-8 bytes."""
    return torch.tensor(list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)


def matrices(key: str, value: torch.Tensor) -> bool:
    """The tensors ComfyUI quantizes: the weight matrices of linear layers (not embeddings)."""
    return (
        key.endswith(".weight") and value.dim() == 2 and "embed" not in key and "shared" not in key
    )


def scaled(
    state: Mapping[str, torch.Tensor], layout: str, fp8: torch.dtype = torch.float8_e4m3fn,
    chosen: Callable[[str, torch.Tensor], bool] = matrices, marker_prefix: str = "",
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # fmt: skip
    """(the file's tensors, the weights they stand for, by key) of ``state`` with the
    ``chosen`` matrices quantized: ``layout`` "scaled_fp8" (the marker, ``scale_weight``,
    ``scale_input``) or "comfy_quant" (``weight_scale``, ``input_scale``, ``comfy_quant``)."""
    stored, want = {}, {}
    for key, value in state.items():
        if not chosen(key, value):
            stored[key], want[key] = value, value
            continue
        layer = key.removesuffix(".weight")
        q, scale = quantize(value, fp8)
        stored[key], want[key] = q, q.to(torch.float32) * scale
        if layout == "scaled_fp8":
            stored[f"{layer}.scale_weight"] = scale
            stored[f"{layer}.scale_input"] = torch.ones(())
        else:
            stored[f"{layer}.weight_scale"] = scale
            stored[f"{layer}.input_scale"] = torch.ones(())
            stored[f"{layer}.comfy_quant"] = description(FORMATS[fp8])
    if layout == "scaled_fp8":
        stored[marker_prefix + "scaled_fp8"] = torch.empty(0, dtype=fp8)
    assert any(v.dtype == fp8 for v in stored.values()), "nothing was quantized"
    return stored, want
