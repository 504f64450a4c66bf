"""Qwen-Image-Edit's kit for the family conformance suite: Qwen-Image's (the same transformer,
VAE, text encoder and file names), on a QwenImageEditPipeline folder; diffusers reads the folder
with transformers' own Qwen2VLProcessor (``transformers_processor``). Sampling and the loss with
a reference image are checked against QwenImageEditPipeline in tests/models/qwenimage_edit/,
which build the reference images these need."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from library.models.families.qwenimage_edit.family import qwenimage_edit_family
from library.models.families.qwenimage_edit.sampling import PIPELINE, PLUS_PIPELINE
from tests.kits.qwenimage.kit import DISTRIBUTED as QWEN_MODES
from tests.kits.qwenimage.kit import KIT as QWEN_KIT
from tests.kits.qwenimage.kit import single_files
from tests.kits.qwenimage_edit.tiny import (
    write_tiny_processor,
    write_tiny_qwenimage_edit_folder,
)

_WITH_REFERENCES = (
    "tests/models/qwenimage_edit/ checks it with a reference image against the pipeline"
)


def transformers_processor(folder: Path):
    """transformers' Qwen2VLProcessor on ``folder``'s tokenizer and image processor (the
    reference for processor.py). Its constructor also builds a video processor, which needs
    torchvision; the image path does not, so the object is assembled around that one check."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen2VLProcessor

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    processor = object.__new__(Qwen2VLProcessor)
    parts = {
        "tokenizer": tokenizer,
        "image_processor": Qwen2VLImageProcessorPil.from_pretrained(str(folder)),
        "video_processor": None,
        "chat_template": None,
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "image_token_id": tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        "video_token_id": tokenizer.convert_tokens_to_ids("<|video_pad|>"),
    }
    for name, value in parts.items():
        object.__setattr__(processor, name, value)
    return processor


def edit_single_files(path: Path, seed: int, version: str):
    """Qwen-Image's single files with the release's model_version, tokenizer_path a processor
    folder (the tokenizer and the image processor settings, as Qwen/Qwen-Image-Edit's
    processor/)."""
    model, flow = single_files(path, seed, model_version=version)
    write_tiny_processor(Path(model["tokenizer_path"]))
    return model, flow


KIT = replace(
    QWEN_KIT,
    variants=("qwenimage-edit",),
    write_folder=lambda path, variant, seed: write_tiny_qwenimage_edit_folder(path, seed),
    pipeline=lambda variant: PIPELINE,
    family=lambda variant, modules: qwenimage_edit_family(),
    pipeline_keys=lambda folder: {"processor": transformers_processor(Path(folder) / "processor")},
    write_single_files=lambda path, variant, seed: edit_single_files(path, seed, "edit"),
    sample_cases=None,
    loss_cases=None,
    loss_reference=None,
    # Qwen-Image's LoRA mode on images with references of two sizes (two groups of
    # micro-batches), with Qwen2.5-VL reading each caption with its reference
    distributed=tuple(
        replace(mode, name="qwenimage-edit-lora", captions=(), references=True)
        for mode in QWEN_MODES[:1]
    ),
    skips={**QWEN_KIT.skips, "sample": _WITH_REFERENCES, "loss": _WITH_REFERENCES},
)

# Qwen-Image-Edit-2509/2511: the same kit on a QwenImageEditPlusPipeline folder (several
# references per sample are checked against the pipeline in tests/models/qwenimage_edit/)
PLUS_KIT = replace(
    KIT,
    variants=("qwenimage-edit-plus",),
    write_folder=lambda path, variant, seed: write_tiny_qwenimage_edit_folder(path, seed, True),
    pipeline=lambda variant: PLUS_PIPELINE,
    family=lambda variant, modules: qwenimage_edit_family(plus=True),
    # the tiny folder's transformer is 2509's (2511's adds zero_cond_t)
    write_single_files=lambda path, variant, seed: edit_single_files(path, seed, "edit-2509"),
    distributed=(),
    skips={
        **KIT.skips,
        "distributed": "qwenimage-edit-lora trains the same transformer, step and reference "
        "batches; the Plus caption template is checked against its pipeline",
    },
)
