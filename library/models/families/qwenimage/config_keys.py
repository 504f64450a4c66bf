"""Qwen-Image's own [flow] keys and the values of the shared model_version: which release a
single transformer file is (musubi-tuner's --model_version), since a file's tensors do not say whether it is the text-to-image model or an
edit model; and whether a LoRA leaves out the blocks' modulation (musubi-tuner's
``networks.lora_qwen_image`` argument exclude_mod)."""

from __future__ import annotations

from pydantic import Field

from library.config.section import Section
from library.models.families.flow_options import check_model_version

# [flow] model_version (musubi-tuner's --model_version; layered is not trained here): which
# release a transformer file is
VERSIONS = {
    "original": "text to image",
    "edit": "Qwen-Image-Edit",
    "edit-2509": "Qwen-Image-Edit-2509, multi-image",
    "edit-2511": "Qwen-Image-Edit-2511, multi-image",
}
# The diffusers pipeline of each release, which a folder's model_index.json names.
PIPELINES: dict[str, str] = {
    "original": "QwenImagePipeline",
    "edit": "QwenImageEditPipeline",
    "edit-2509": "QwenImageEditPlusPipeline",
    "edit-2511": "QwenImageEditPlusPipeline",
}


class QwenImageFlowKeys(Section):
    """musubi-tuner's LoRA's exclude_mod ([flow] model_version is shared: VERSIONS)."""

    exclude_mod: bool | None = Field(
        None,
        description="Qwen-Image LoRAs: leave out each block's timestep modulation Linears "
        "(img_mod, txt_mod), as musubi-tuner's networks.lora_qwen_image does by default; false "
        "adapts them too (musubi-tuner's network_args exclude_mod=False, also accepted there). "
        "Unset: true. LyCORIS' preset decides instead (full adds them).",
    )


def check_folder_version(flow, pipeline: str, path) -> None:
    """ModelError when [flow] model_version names another release than the folder's
    ``pipeline``."""
    fits = sorted(v for v, p in PIPELINES.items() if p == pipeline)
    check_model_version(getattr(flow, "model_version", None), fits, path, f"a {pipeline} folder")
