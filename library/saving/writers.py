"""Write what a run produces: a kohya-format LoRA file, or a fine-tuned model (file and folder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from library.saving.atomic import atomic_write_dir
from library.saving.checkpoint_export import ensure_text_model_layout
from library.saving.lora_file import save_lora_file
from library.saving.streamed import save_streamed

SAVE_DTYPES = {"float": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def write_lora(path: Path, models: dict[str, torch.nn.Module], metadata: dict[str, str] | None, dtype: torch.dtype, family, layout: str = "kohya") -> None:
    """Save the adapters of ``models`` (kohya prefix -> model) as one LoRA file, in ``family``'s
    (a ModelFamily) kohya key layout, or with ``layout`` "diffusers" in diffusers' peft one."""
    tensors = family.diffusers_lora_tensors(models) if layout == "diffusers" else family.lora_tensors(models)
    save_lora_file(path, tensors, metadata, dtype)


def write_checkpoint(path: Path, denoiser: torch.nn.Module, components, metadata: dict[str, str] | None, dtype: torch.dtype) -> None:
    """A full fine-tune as the one file users load, in its family's layout (SD: an
    original-layout checkpoint with the base VAE and text encoders; FLUX.1: the transformer in
    Black Forest Labs' layout)."""
    components.family.write_full_model(path, denoiser, components, metadata, dtype)


def write_pipeline_folder(folder: Path, denoiser: torch.nn.Module, base_dir: Path, dtype: torch.dtype, subfolder: str = "unet") -> None:
    """A diffusers model folder: the base model's other components plus the trained denoiser
    (in ``subfolder``: "unet", or "transformer" for FLUX.1).

    Text encoders copied from a folder that transformers 5 wrote lack the ``text_model.`` key
    prefix, which transformers 4.x then silently re-initialises; they are rewritten with it.
    """

    def write(tmp: Path) -> None:
        for entry in base_dir.iterdir():
            if entry.name == subfolder:
                continue
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            else:
                shutil.copy2(entry, tmp / entry.name)
        for encoder in sorted(tmp.glob("text_encoder*")):
            ensure_text_model_layout(encoder)
        (tmp / subfolder).mkdir()
        denoiser.save_config(tmp / subfolder)
        weights = tmp / subfolder / "diffusion_pytorch_model.safetensors"
        save_streamed(weights, [denoiser.state_dict()], dtype=dtype)  # one tensor at a time

    atomic_write_dir(folder, write)
