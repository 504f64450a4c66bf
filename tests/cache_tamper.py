"""Ways to damage a cache file while keeping its header: shared by the latent- and text-cache
damage tests. Each ``change(tensors, meta)`` edits what `rewrite` read before saving it again."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.torch import save_file

from library.data.content_hash import tensor_digest


def rewrite(file: Path, change) -> None:
    """Save `file` again with its metadata as read, after change(tensors, metadata)."""
    with safe_open(str(file), framework="pt") as handle:
        meta = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    change(tensors, meta)
    save_file(tensors, str(file), meta)


def checksum_key(meta: dict) -> str:
    """The metadata key holding the tensors' checksum (its name differs between the caches)."""
    return next(key for key in meta if "checksum" in key)


def scale_by_two(name):
    def change(tensors, meta):
        tensors[name] = tensors[name] * 2

    return change


def put_nan(name, forge_checksum=False):
    def change(tensors, meta):
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[3] = float("nan")
        if forge_checksum:  # a forged checksum: only the values' own check is left
            meta[checksum_key(meta)] = tensor_digest(tensors)

    return change


def drop_checksum(tensors, meta):
    del meta[checksum_key(meta)]


def garbage_tensor_bytes(file: Path, seed: int = 0) -> None:
    """Replace every byte after the safetensors header by random bytes (same file size)."""
    data = file.read_bytes()
    start = 8 + struct.unpack("<Q", data[:8])[0]
    noise = np.random.default_rng(seed).integers(0, 256, len(data) - start, dtype=np.uint8)
    file.write_bytes(data[:start] + noise.tobytes())
