"""Read a single weights file (.safetensors, or .ckpt/.pt/.pth/.bin) without running its code.

``.ckpt`` and the other torch formats are pickles; they are read with
``torch.load(weights_only=True)``, which only rebuilds tensors and plain containers and refuses
any other class. A file that needs one (a pickled training callback, a custom class) is refused
with the advice to convert it to safetensors with a tool the user trusts.

ComfyUI's scaled fp8 files are read as the weights they stand for (scaled_fp8.py): a scaled
weight comes back dequantized, in float32, and its scales and their markers are not among the
file's keys; a file whose quantized layers cannot be read says why in ``unreadable``.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from library.errors import ModelError
from library.models.scaled_fp8 import FLOAT8, FLOAT8_NAMES, Scales, dequantized, find_scales

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")


class CheckpointFile:
    """The tensors of one file, by key, read on demand; ``metadata`` is the safetensors header's
    string map (empty for pickled files)."""

    def __init__(
        self,
        path: Path,
        tensors: Mapping[str, torch.Tensor] | None = None,
        metadata=None,
        label: str = "the file",
    ):
        """``label`` names the file in the advice of a damaged file's error ("the FLUX.1 file")."""
        self.path = path
        self.label = label
        self._handle = None
        self._keys: list[str] | None = None
        self._scales = Scales()
        self._tensors: Mapping[str, torch.Tensor] = tensors or {}
        self.metadata: dict[str, str] = dict(metadata or {})
        if tensors is not None:
            return
        if path.suffix.lower() == ".safetensors":
            self._open_safetensors()
        elif path.suffix.lower() in PICKLE_SUFFIXES:
            self._tensors = _load_pickled(path)
        else:
            raise ModelError(
                f"{path}: unknown weights format {path.suffix!r}; use .safetensors (or .ckpt)"
            )

    def _open_safetensors(self) -> None:
        try:
            self._handle = safe_open(str(self.path), framework="pt")
        except (SafetensorError, OSError) as exc:
            raise ModelError(
                f"{self.path} is corrupt or truncated ({_one_line(exc)}); re-download "
                f"{self.label}"
            ) from None
        self.metadata = dict(self._handle.metadata() or {})

    def keys(self) -> list[str]:
        """The file's tensors, without the scales of scaled fp8 weights and their markers."""
        if self._keys is None:
            source = self._handle.keys() if self._handle is not None else self._tensors
            stored = list(source)
            self._scales = find_scales(
                stored, self.shape, self._is_float8, self._stored, self.metadata
            )
            self._keys = [k for k in stored if k not in self._scales.hidden]
        return self._keys

    @property
    def unreadable(self) -> str | None:
        """Why the file's weights cannot be read (a quantization difftune does not read, a
        scale that fits no weight), naming the key; None when they can."""
        self.keys()
        return self._scales.problem

    def refuse_unreadable(self, what: str = "", released: str | None = None) -> None:
        """ModelError when the file's weights cannot be read (``unreadable``), naming the file
        as ``what = path`` (``what``: the key that names it) and the files to use instead
        (``released``: the released file's name, said with a diffusers folder)."""
        problem = self.unreadable
        if problem:
            where = f"{what} = {self.path}" if what else str(self.path)
            instead = f" ({released}) or a diffusers folder" if released else ""
            raise ModelError(
                f"{where}: {problem}; use the model's bf16, fp16, fp8 or scaled fp8 file{instead}"
            )

    def __iter__(self):
        return iter(self.keys())

    def __contains__(self, key: object) -> bool:
        return key in set(self.keys())

    def shape(self, key: str) -> tuple[int, ...]:
        if self._handle is not None:
            return tuple(self._handle.get_slice(key).get_shape())
        return tuple(self._tensors[key].shape)

    def tensor(self, key: str) -> torch.Tensor:
        """The tensor ``key`` stands for: a scaled fp8 weight dequantized, in float32."""
        self.refuse_unreadable()
        scale = self._scales.of.get(key)
        if scale is None:
            return self._stored(key)
        return dequantized(self._stored(key), self._stored(scale))

    def _is_float8(self, key: str) -> bool:
        if self._handle is not None:
            return self._handle.get_slice(key).get_dtype() in FLOAT8_NAMES
        return self._tensors[key].dtype in FLOAT8

    def _stored(self, key: str) -> torch.Tensor:
        if self._handle is None:
            return self._tensors[key]
        try:
            return self._handle.get_tensor(key)
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise ModelError(f"cannot read {key} from {self.path}: {_one_line(exc)}") from None


def _torch_load(path: Path):
    """The file's objects, its tensors mapped from the file where its format allows (each read
    when used); torch's legacy format (before 1.6) has no such mapping and is read whole."""
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
    return torch.load(str(path), map_location="cpu", weights_only=True)


def _load_pickled(path: Path) -> dict[str, torch.Tensor]:
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore", UserWarning)
            data = _torch_load(path)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found is None and _is_plain_pickle(path):
            raise ModelError(
                f"{path} is a plain Python pickle, not a file torch.save wrote; difftune reads "
                "only torch's own format and never runs pickled code: convert it to "
                ".safetensors with a tool you trust"
            ) from None
        if found is None:
            raise ModelError(
                f"{path} is corrupt or truncated (not a readable torch file)"
            ) from None
        raise ModelError(
            f"{path} holds pickled Python objects besides tensors ({found.group(1)}); difftune "
            "never runs code from a model file: convert it to .safetensors with a tool you trust"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise ModelError(f"{path} is corrupt or truncated ({_one_line(exc)})") from None
    # Lightning checkpoints nest the weights under "state_dict" (sometimes twice).
    while isinstance(data, dict) and isinstance(data.get("state_dict"), dict):
        data = data["state_dict"]
    if not isinstance(data, dict):
        raise ModelError(f"{path} does not hold a dict of tensors")
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}


# torch.save's zip format starts like any zip file; its legacy format with a pickled magic number
_TORCH_STARTS = (b"PK\x03\x04", b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19")


def _is_plain_pickle(path: Path) -> bool:
    """A pickle stream (protocol opcode first) that torch.save did not write."""
    with open(path, "rb") as file:
        head = file.read(16)
    return head[:1] == b"\x80" and not head.startswith(_TORCH_STARTS)


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
