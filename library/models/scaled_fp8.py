"""ComfyUI's scaled fp8 files, read as the weights they stand for.

Such a file stores a layer's weight in float8 with a scale beside it; the weight is the float8
tensor times its scale. ComfyUI writes two layouts:

- "scaled fp8" (t5xxl_fp8_e4m3fn_scaled, umt5_xxl_fp8_e4m3fn_scaled, ...): a marker tensor
  ``scaled_fp8`` (under the model's prefix in a full checkpoint) and, beside each float8
  ``X.weight``, ``X.scale_weight``; maybe ``X.scale_input``.
- the mixed one ("fp8mixed", "fp8_scaled" of newer releases): beside a quantized ``X.weight``,
  ``X.weight_scale``, maybe ``X.input_scale``, and ``X.comfy_quant``, the layer's description:
  JSON in a uint8 tensor, ``{"format": "float8_e4m3fn"}``. A file may describe its layers in its
  header instead: ``_quantization_metadata`` = ``{"layers": {"X": {"format": ...}}}``.

A scale is one float32 value for the whole tensor, or one per output row (shape [out, 1, ...]).
Layers left in bf16 or fp16 have none. Input scales serve only float8 matrix products, which
difftune does not run: they are left out. Of the described formats, float8_e4m3fn and
float8_e5m2 are read; the others (nvfp4, mxfp8, int8, ...) store blocks of values with a scale
each and are refused by name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

MARKER = "scaled_fp8"  # the first layout's marker (its last name part)
OLD_SCALE, OLD_INPUT = ".scale_weight", ".scale_input"
SCALE, INPUT, DESCRIPTION = ".weight_scale", ".input_scale", ".comfy_quant"
HEADER_LAYERS = "_quantization_metadata"
READ_FORMATS = ("float8_e4m3fn", "float8_e5m2")
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FLOAT8_NAMES = ("F8_E4M3", "F8_E5M2")  # as safetensors headers name them


@dataclass(frozen=True)
class Scales:
    """How a file's tensors are read: the scale key of each scaled weight, the keys that are
    no weights (scales, input scales, descriptions, the marker), and why the file cannot be
    read (naming the key), or None."""

    of: Mapping[str, str] = field(default_factory=dict)
    hidden: frozenset[str] = frozenset()
    problem: str | None = None


def dequantized(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The weight a stored (float8) weight and its scale stand for, in float32."""
    scale = scale.to(torch.float32)
    if scale.numel() == 1:  # one value, whatever its shape ([], [1], [1, 1])
        scale = scale.reshape(())
    return weight.to(torch.float32) * scale


def find_scales(
    keys: list[str], shape: Callable[[str], tuple[int, ...]], is_float8: Callable[[str], bool],
    read: Callable[[str], torch.Tensor], metadata: Mapping[str, str],
) -> Scales:  # fmt: skip
    """The scales of a file with ``keys`` (``shape``, ``is_float8`` and ``read`` of a key as
    stored; ``metadata``: its header's strings). A scale counts where its layer is described
    (the marker, a description) or its weight is float8: elsewhere it is a model's own tensor."""
    present = set(keys)
    markers = {k for k in keys if k.rsplit(".", 1)[-1] == MARKER}
    formats, problem = _formats(keys, read, metadata)
    scales: dict[str, str] = {}
    hidden = markers | {k for k in keys if k.endswith(DESCRIPTION)}
    for key in keys:
        suffix = next((s for s in (OLD_SCALE, SCALE) if key.endswith(s)), None)
        if suffix is None:
            continue
        layer = key[: -len(suffix)]
        weight = layer + ".weight"
        described = bool(markers) if suffix == OLD_SCALE else layer in formats
        if weight not in present:
            problem = problem or (f"{key} is a scale without its {weight}" if described else None)
            continue
        if not (described or is_float8(weight)):
            continue
        problem = problem or _shape_problem(key, shape(key), weight, shape(weight))
        scales[weight] = key
        hidden.add(key)
    for key in keys:
        suffix = next((s for s in (OLD_INPUT, INPUT) if key.endswith(s)), None)
        if suffix is not None and key[: -len(suffix)] + ".weight" in scales:
            hidden.add(key)
    unscaled = [w for w in (f"{x}.weight" for x in formats) if w in present and w not in scales]
    if unscaled and problem is None:
        layer = unscaled[0].removesuffix(".weight")
        problem = f"{layer} is described as float8 with a scale, but {layer}{SCALE} is missing"
    return Scales(scales, frozenset(hidden), problem)


def _formats(
    keys: list[str], read: Callable[[str], torch.Tensor], metadata: Mapping[str, str]
) -> tuple[dict[str, str], str | None]:
    """(each described layer's format, from its description or the header; why one cannot be
    read, or None)."""
    described: dict[str, tuple[object, str]] = {}  # layer -> (format, where it is said)
    header = metadata.get(HEADER_LAYERS)
    if header:
        try:
            layers = json.loads(header)["layers"]
            where = f"the header's {HEADER_LAYERS}"
            described |= {layer: (_format_of(d), where) for layer, d in layers.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return {}, f'its header\'s {HEADER_LAYERS} is not JSON with a "layers" map'
    for key in keys:
        if key.endswith(DESCRIPTION):
            try:
                said = json.loads(read(key).to(torch.uint8).numpy().tobytes())
            except (ValueError, TypeError, RuntimeError):
                return {}, f'{key} is not a layer description (JSON with a "format")'
            described[key[: -len(DESCRIPTION)]] = (_format_of(said), key)
    for layer, (fmt, where) in described.items():
        if fmt not in READ_FORMATS:
            return {}, (
                f"{where} stores {layer} as {fmt!r}, a quantization difftune does not read "
                f"(it reads {' and '.join(READ_FORMATS)} with a scale)"
            )
    return {layer: fmt for layer, (fmt, _) in described.items()}, None


def _format_of(description: object) -> object:
    """The format a layer description names ({"format": ...}, or the name alone)."""
    return description.get("format") if isinstance(description, dict) else description


def _shape_problem(
    key: str, scale: tuple[int, ...], weight: str, stored: tuple[int, ...]
) -> str | None:
    """Why a scale of shape ``scale`` scales no weight of shape ``stored``: it is neither one
    value nor one per output row ([out, 1, ...]); None when it does."""
    if math.prod(scale) == 1:
        return None
    if len(scale) == len(stored) and scale[0] == stored[0] and math.prod(scale) == scale[0]:
        return None
    return (
        f"{key} has shape {tuple(scale)}, which scales {weight} {tuple(stored)} neither as a "
        "whole nor row by row (a block-wise scale, which difftune does not read)"
    )
