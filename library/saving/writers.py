"""Write what a run produces: a kohya-format LoRA file, or a fine-tuned UNet (file and folder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from library.networks.kohya_keys import export_lora
from library.saving.atomic import atomic_write_dir, atomic_write_file
from library.saving.lora_file import save_lora_file

SAVE_DTYPES = {"float": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def write_lora(path: Path, models: dict[str, torch.nn.Module], metadata: dict[str, str] | None, dtype: torch.dtype) -> None:
    """Save the adapters of ``models`` (kohya prefix -> model) as one kohya LoRA file."""
    save_lora_file(path, export_lora(models), metadata, dtype)


def _unet_tensors(unet: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in unet.state_dict().items()}


def write_unet_file(path: Path, unet: torch.nn.Module, metadata: dict[str, str] | None, dtype: torch.dtype) -> None:
    """The UNet's weights (diffusers key names) as one safetensors file."""
    tensors = _unet_tensors(unet, dtype)
    atomic_write_file(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def write_pipeline_folder(folder: Path, unet: torch.nn.Module, base_dir: Path, dtype: torch.dtype) -> None:
    """A diffusers model folder: the base model's other components plus the trained UNet."""
    tensors = _unet_tensors(unet, dtype)

    def write(tmp: Path) -> None:
        for entry in base_dir.iterdir():
            if entry.name == "unet":
                continue
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            else:
                shutil.copy2(entry, tmp / entry.name)
        (tmp / "unet").mkdir()
        unet.save_config(tmp / "unet")
        save_file(tensors, tmp / "unet" / "diffusion_pytorch_model.safetensors")

    atomic_write_dir(folder, write)
