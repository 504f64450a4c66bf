"""Write a large safetensors file one piece at a time, so a save needs no second copy of the model.

A full fine-tune's weights file is the whole model. Casting every tensor to the save precision
(or copying it off the accelerator) before writing, as a plain ``save_file`` call needs, holds a
second copy of the model in host memory for the length of the save. Here the header is worked
out first from shapes alone (the layout conversion run on meta tensors), then each group of
tensors is converted, cast and written in turn, and let go before the next. The file is an
ordinary safetensors file: any reader loads it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from library.saving.atomic import atomic_write_file

# safetensors' names of the dtypes a model file may hold
DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}

Tensors = Mapping[str, torch.Tensor]
Convert = Callable[[Tensors], Tensors]
# tensors to write as they are, or with the conversion (key layout, fused parts) they need
Group = Tensors | tuple[Tensors, Convert]


def _identity(tensors: Tensors) -> Tensors:
    return tensors


def _meta(tensors: Tensors) -> dict[str, torch.Tensor]:
    return {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in tensors.items()}


def _saved_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    # only floating weights take the save precision; integer buffers keep theirs
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def _header(
    groups: list[tuple[Tensors, Convert]], dtype: torch.dtype | None, metadata: dict | None
) -> tuple[bytes, list[str]]:
    """The header bytes (length prefix included) and the keys in the order they are written."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    order, offset = [], 0
    for group, convert in groups:
        for key, tensor in convert(_meta(group)).items():
            saved = _saved_dtype(tensor, dtype)
            size = tensor.numel() * saved.itemsize
            header[key] = {
                "dtype": DTYPE_NAMES[saved],
                "shape": list(tensor.shape),
                "data_offsets": [offset, offset + size],
            }
            order.append(key)
            offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(text)) + text, order


def save_streamed(
    path: str | Path,
    groups: Iterable[Group],
    metadata: dict[str, str] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the tensors of ``groups`` as one safetensors file, atomically. A group is a dict of
    tensors, or (tensors, convert) where ``convert`` maps them to the keys and tensors to write
    (a key-layout conversion that fuses parts of one block: the group must hold every part).

    Floating tensors are written in ``dtype`` (None: as they are), each moved to host memory and
    cast just before it is written; at most one converted group is held at a time.
    """
    pairs = [g if isinstance(g, tuple) else (g, _identity) for g in groups]
    head, order = _header(pairs, dtype, metadata)

    def write(tmp: Path) -> None:
        written = []
        with open(tmp, "wb") as file:
            file.write(head)
            for group, convert in pairs:
                for key, tensor in convert(group).items():
                    host = tensor.detach().to("cpu", _saved_dtype(tensor, dtype)).contiguous()
                    if host.numel():
                        file.write(host.reshape(-1).view(torch.uint8).numpy().data)
                    written.append(key)
                    del host
        if written != order:  # a conversion must give the same keys for meta and real tensors
            raise RuntimeError(f"{tmp}: tensors written out of the header's order")

    return atomic_write_file(path, write)


def block_groups(state: Tensors, block_prefixes: tuple[str, ...]) -> list[dict[str, torch.Tensor]]:
    """``state`` split into one group per numbered block (``<prefix><n>.``) and one group of the
    other keys, in first-seen order: the groups a per-block layout conversion can take alone."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        name = ""
        for prefix in block_prefixes:
            if key.startswith(prefix):
                name = prefix + key[len(prefix) :].split(".", 1)[0]
                break
        groups.setdefault(name, {})[key] = value
    return list(groups.values())
