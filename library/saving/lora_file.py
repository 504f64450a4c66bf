"""Read and write kohya-format LoRA files (flat safetensors with string metadata).

Weights are saved in the requested dtype; each ``.alpha`` stays a float32 scalar so that an alpha
such as 0.1 keeps its exact value (readers call ``.item()`` on it, whatever its dtype).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from pathlib import Path

import torch

from library.errors import CheckpointError
from library.saving.atomic import atomic_write_file
from library.user_files import starts_like_pickle

# kohya's LoRA/LoCon, and LyCORIS' LoHa and LoKr (whose LoCon uses kohya's names).
_LORA_SUFFIXES = (
    ".lora_down.weight",
    ".lora_up.weight",
    ".hada_w1_a",
    ".hada_w2_a",
    ".lokr_w1",
    ".lokr_w1_a",
)
_PEFT_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


def _prepare(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out = {}
    for key, tensor in tensors.items():
        target = torch.float32 if key.endswith(".alpha") else dtype
        out[key] = tensor.detach().to("cpu", target).contiguous()
    return out


def model_hashes(tensors: dict[str, torch.Tensor], metadata: Mapping[str, str]) -> dict[str, str]:
    """kohya's ``sshs_model_hash`` / ``sshs_legacy_hash`` (shown by A1111's networks UI).

    model hash: sha256 of the tensor data after the safetensors header. legacy hash: first 8 hex
    digits of sha256 over 64 KiB at offset 1 MiB of the file written with only the ss_* keys.
    """
    from safetensors.torch import save

    ss_only = {k: v for k, v in metadata.items() if k.startswith("ss_")}
    blob = save(tensors, metadata=ss_only)
    header_len = int.from_bytes(blob[:8], "little")
    model_hash = hashlib.sha256(blob[8 + header_len :]).hexdigest()
    legacy = io.BytesIO(blob)
    legacy.seek(0x100000)
    legacy_hash = hashlib.sha256(legacy.read(0x10000)).hexdigest()[:8]
    return {"sshs_model_hash": model_hash, "sshs_legacy_hash": legacy_hash}


def save_lora_file(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None,
    dtype: torch.dtype,
) -> Path:
    """Atomically write ``tensors`` (cast to ``dtype``, alphas float32) with ``metadata``.

    With metadata, kohya's two file hashes are added to it. Metadata values must be strings.
    """
    from safetensors.torch import save_file

    prepared = _prepare(tensors, dtype)
    header: dict[str, str] | None = None
    if metadata is not None:
        bad = [k for k, v in metadata.items() if not isinstance(v, str)]
        if bad:
            raise TypeError(f"metadata values must be strings; {bad[0]!r} is not")
        header = dict(metadata)
        header.update(model_hashes(prepared, header))
    return atomic_write_file(path, lambda tmp: save_file(prepared, str(tmp), metadata=header))


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors on the CPU, metadata) of any safetensors file; CheckpointError naming the file
    when it is missing or unreadable."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        if starts_like_pickle(path):
            raise CheckpointError(
                f"{path}: a pickled PyTorch file (what torch.save writes: .pt, .ckpt, .bin), "
                "which difftune does not read (unpickling can run code from the file); convert "
                "it to .safetensors where you trust it (safetensors.torch.save_file of its "
                "tensors)"
            ) from None
        raise CheckpointError(
            f"{path}: not a readable safetensors file (truncated or corrupt?): {exc}"
        ) from exc
    return tensors, metadata


def read_lora_file(
    path: str | Path, diffusers_layout: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load a kohya LoRA or LyCORIS file, or with ``diffusers_layout`` also a diffusers/peft one (lora_A /
    lora_B keys): (tensors on the CPU, metadata). CheckpointError if unusable."""
    path = Path(path)
    if not path.is_file():  # the trainer's wording; read_safetensors says "<path>: file not found"
        raise CheckpointError(f"LoRA file not found: {path}")
    tensors, metadata = read_safetensors(path)
    check_lora_keys(tensors, path, diffusers_layout)
    return tensors, metadata


def check_lora_keys(
    tensors: Mapping[str, torch.Tensor], source: str | Path, diffusers_layout: bool = False
) -> None:
    """CheckpointError naming ``source`` unless the keys hold kohya LoRA or LyCORIS weights
    (or, with ``diffusers_layout``, diffusers/peft ones): what ``read_lora_file`` requires."""
    if not any(key.endswith(_LORA_SUFFIXES) for key in tensors):
        peft = any(key.endswith(_PEFT_SUFFIXES) for key in tensors)
        if peft and diffusers_layout:
            return
        if peft:
            raise CheckpointError(
                f"{source}: is a diffusers/PEFT-format LoRA (lora_A/lora_B keys); only "
                "kohya-format files (lora_down/lora_up) can be loaded"
            )
        raise CheckpointError(
            f"{source}: not a LoRA file (no lora_down/lora_up, hada_* or lokr_* weights)"
        )
