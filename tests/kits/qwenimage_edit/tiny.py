"""A tiny Qwen-Image-Edit for tests: Qwen-Image's tiny parts as a QwenImageEditPipeline folder,
with processor/ holding Qwen2.5-VL's image processor settings (the released values) and the
tiny tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from library.models.families.qwenimage_edit.sampling import PIPELINE, PLUS_PIPELINE
from tests.kits.qwenimage.tiny import write_tiny_qwenimage_folder
from tests.kits.qwenimage.tiny_tokenizer import write_tiny_qwen25vl_tokenizer

# Qwen2.5-VL's preprocessor_config.json as Qwen/Qwen-Image-Edit's processor/ has it.
IMAGE_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_pixels": 12845056,
    "min_pixels": 3136,
    "merge_size": 2,
    "patch_size": 14,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "temporal_patch_size": 2,
}


def write_tiny_processor(folder: Path) -> Path:
    """A processor folder as Qwen/Qwen-Image-Edit's processor/: the tiny tokenizer's files and
    preprocessor_config.json; returns ``folder``."""
    write_tiny_qwen25vl_tokenizer(folder)
    text = json.dumps(IMAGE_PROCESSOR, indent=2, sort_keys=True) + "\n"
    (folder / "preprocessor_config.json").write_text(text, encoding="utf-8")
    return folder


def write_tiny_qwenimage_edit_folder(path: str | Path, seed: int = 0, plus: bool = False) -> Path:
    """Write a tiny Qwen-Image-Edit diffusers folder to ``path`` (``plus``: a
    QwenImageEditPlusPipeline folder, as Qwen-Image-Edit-2509's); returns ``path``."""
    path = write_tiny_qwenimage_folder(path, seed)
    write_tiny_processor(path / "processor")
    index_file = path / "model_index.json"
    index = json.loads(index_file.read_text(encoding="utf-8"))
    pipeline = PLUS_PIPELINE if plus else PIPELINE
    index |= {"_class_name": pipeline, "processor": ["transformers", "Qwen2VLProcessor"]}
    index_file.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path
