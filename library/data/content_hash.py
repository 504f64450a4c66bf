"""Content identities for caches: a file is known by its bytes and a model by its weights, so a
cache entry survives moves and renames and is never reused after an edit."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from library.errors import DataError

_CHUNK = 1 << 20
# Hashing every image of a dataset is the cost of content identity; remembering the digest per
# (file, size, mtime) means a process pays it once however often the file is looked up.
_MEMO: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | Path) -> str:
    """Hex blake2b (16-byte digest) of the file's bytes, memoised per process by (resolved path,
    size, mtime_ns); of a folder (a video's frames), of its files' names and digests. Raises
    DataError naming the file if it cannot be read."""
    path = Path(path)
    if path.is_dir():
        return _folder_digest(path)
    try:
        resolved = path.resolve()
        stat = os.stat(resolved)
        memo_key = (str(resolved), stat.st_size, stat.st_mtime_ns)
        if memo_key in _MEMO:
            return _MEMO[memo_key]
        digest = hashlib.blake2b(digest_size=16)
        with open(resolved, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError as error:
        reason = error.strerror or str(error)
        raise DataError(f"image {path} cannot be read ({reason}); replace or remove it") from error
    _MEMO[memo_key] = digest.hexdigest()
    return _MEMO[memo_key]


def _folder_digest(folder: Path) -> str:
    """Hex blake2b of the names and digests of a folder's files, by name: a folder of frames is
    known by every frame's bytes and place."""
    digest = hashlib.blake2b(digest_size=16)
    for entry in sorted(folder.iterdir()):
        if entry.is_file():
            digest.update(f"{entry.name}\0{file_digest(entry)}\0".encode())
    return digest.hexdigest()


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def tensor_digest(module_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor]) -> str:
    """Hex blake2b (16-byte digest) of every tensor of a module (its state dict: parameters and
    buffers) or state dict: in sorted name order, each tensor's name, dtype, shape and raw bytes.

    Equal weights give equal digests whatever the device or insertion order; any changed value,
    dtype, shape or name gives another digest.
    """
    if isinstance(module_or_state_dict, torch.nn.Module):
        state = module_or_state_dict.state_dict()
    else:
        state = module_or_state_dict
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        tensor = state[name]
        data = _raw_bytes(tensor)
        # Lengths in the header make the byte stream unambiguous between neighbouring tensors.
        header = f"{len(name)}:{name}|{tensor.dtype}|{tuple(tensor.shape)}|{len(data)}|"
        digest.update(header.encode())
        digest.update(data)
    return digest.hexdigest()


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element of `tensor` is finite (no NaN, no Inf); true for integer tensors."""
    if not tensor.is_floating_point():
        return True
    if tensor.device.type != "cpu":  # not every accelerator has float64; there this is cheap
        if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # no isfinite for float8
            tensor = tensor.to(torch.bfloat16)
        return bool(torch.isfinite(tensor).all())
    # One float64 sum is several times cheaper than isfinite().all() and exact for this question:
    # any NaN or Inf makes the sum non-finite, and finite float32 values cannot overflow float64.
    return bool(torch.isfinite(tensor.sum(dtype=torch.float64)))


def tensors_damage(tensors: Mapping[str, torch.Tensor], checksum: str | None) -> str | None:
    """Why the tensors read back from a cache file cannot be used, or None when they can.

    `checksum` is the file's stored tensor_digest of what was written. The answer is "no
    checksum", "checksum mismatch" or "non-finite values" (a cache never holds a NaN or an Inf).
    """
    if not checksum:
        return "no checksum"
    if tensor_digest(tensors) != checksum:
        return "checksum mismatch"
    if not all(all_finite(tensor) for tensor in tensors.values()):
        return "non-finite values"
    return None
