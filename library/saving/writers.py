"""Write what a run produces: a kohya-format LoRA file, or a fine-tuned model (file and folder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from library.saving.atomic import atomic_write_dir
from library.saving.checkpoint_export import ensure_text_model_layout, export_full_unet_checkpoint
from library.saving.lora_file import save_lora_file

SAVE_DTYPES = {"float": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def write_lora(path: Path, models: dict[str, torch.nn.Module], metadata: dict[str, str] | None, dtype: torch.dtype, family) -> None:
    """Save the adapters of ``models`` (kohya prefix -> model) as one kohya LoRA file, in the
    key layout of ``family`` (a ModelFamily)."""
    save_lora_file(path, family.lora_tensors(models), metadata, dtype)


def write_checkpoint(path: Path, unet: torch.nn.Module, components, metadata: dict[str, str] | None, dtype: torch.dtype) -> None:
    """A full fine-tune as one original-layout checkpoint (what A1111/Forge and ComfyUI load):
    the trained UNet with the base model's VAE and text encoders."""
    export_full_unet_checkpoint(path, unet, components, components.family, dtype, metadata)


def write_pipeline_folder(folder: Path, unet: torch.nn.Module, base_dir: Path, dtype: torch.dtype) -> None:
    """A diffusers model folder: the base model's other components plus the trained UNet.

    Text encoders copied from a folder that transformers 5 wrote lack the ``text_model.`` key
    prefix, which transformers 4.x then silently re-initialises; they are rewritten with it.
    """
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in unet.state_dict().items()}

    def write(tmp: Path) -> None:
        for entry in base_dir.iterdir():
            if entry.name == "unet":
                continue
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            else:
                shutil.copy2(entry, tmp / entry.name)
        for encoder in sorted(tmp.glob("text_encoder*")):
            ensure_text_model_layout(encoder)
        (tmp / "unet").mkdir()
        unet.save_config(tmp / "unet")
        save_file(tensors, tmp / "unet" / "diffusion_pytorch_model.safetensors")

    atomic_write_dir(folder, write)
