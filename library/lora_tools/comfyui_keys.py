"""The module names ComfyUI gives a model's layers: the ones its "Extract and Save Lora" node
writes (comfy_extras/nodes_lora_extract.py), and every one its LoRA loader accepts (a reproduction
of comfy/lora.py ``model_lora_keys_unet`` / ``model_lora_keys_clip``, read from
Comfy-Org/ComfyUI in 2026; written from those facts, no ComfyUI code)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from library.lora_tools.base_model import DENOISER, Layer
from library.models.families.registry import entry_of

# CLIP layers ComfyUI maps kohya's lora_te*_ names to (comfy/lora.py LORA_CLIP_MAP).
_CLIP_LAYER = re.compile(
    r"text_model\.encoder\.layers\.(\d+)\.(mlp\.fc1|mlp\.fc2|self_attn\.[qkv]_proj|self_attn\.out_proj)"
)


def comfy_clip_names(components) -> tuple[str | None, ...]:
    """ComfyUI's name of each text encoder (its CLIP model's state-dict prefix): clip_l, clip_h
    (SD 2.x's OpenCLIP-H), clip_g, t5xxl; None for another kind of encoder (a Qwen3), whose
    names in ComfyUI's LoRA layout are not reproduced here."""
    names: list[str | None] = []
    clips = 0
    for encoder in components.text_encoders:
        kind = type(encoder).__name__
        if kind.startswith("T5"):
            names.append("t5xxl")
            continue
        if not kind.startswith("CLIP"):
            names.append(None)
            continue
        if clips == 0:
            names.append("clip_h" if components.family.v2 else "clip_l")
        else:
            names.append("clip_g")
        clips += 1
    return tuple(names)


def comfy_name(layer: Layer, components) -> str | None:
    """The module's name in ComfyUI's own layout (what its LoRA-save node writes); None for a
    layer of a text encoder ComfyUI's names are not known for (``comfy_clip_names``)."""
    if layer.component == DENOISER:
        comfy_original = entry_of(components.family).tool.comfy_original
        return f"diffusion_model.{comfy_original(layer) if comfy_original else layer.original}"
    clip = comfy_clip_names(components)[layer.component]
    return None if clip is None else f"text_encoders.{clip}.transformer.{layer.original}"


def comfy_names(table: Mapping[str, Layer], components) -> dict[str, str]:
    """ComfyUI's own name of each layer of the model (``comfy_name``) -> its kohya name."""
    names = {name: comfy_name(layer, components) for name, layer in table.items()}
    return {comfy: name for name, comfy in names.items() if comfy is not None}


def comfy_key_map(components, table) -> dict[str, tuple[Layer, tuple[int, ...] | None]]:
    """The module names ComfyUI's loader accepts for this model -> (layer, the parts of it the
    name stands for; None: all of it)."""
    tool = entry_of(components.family).tool
    family_keys = tool.comfy_keys
    clips = comfy_clip_names(components)
    key_map: dict[str, tuple[Layer, tuple[int, ...] | None]] = {}
    for layer in table.values():
        whole = (layer, None)
        if layer.component == DENOISER:
            original = comfy_name(layer, components).removeprefix("diffusion_model.")
            # ComfyUI's generic names come from its own model's weights, which may be named
            # otherwise than the layout convert writes, or fused from several layers (None)
            model_name = tool.comfy_model_name(layer) if tool.comfy_model_name else original
            if model_name is not None:
                key_map["lora_unet_" + model_name.replace(".", "_")] = whole
                key_map["diffusion_model." + model_name] = whole
            # the family's own names: diffusers', kohya's and LyCORIS' paths of the layer or of
            # its parts (library.models.families.family_entry.ToolFacts.comfy_keys)
            for name, parts in (family_keys(layer, original) if family_keys else {}).items():
                key_map[name] = (layer, parts)
            continue
        clip = clips[layer.component]
        if clip is None:
            continue
        path = layer.original
        key_map[f"text_encoders.{clip}.transformer.{path}"] = whole
        if not clip.startswith("clip_"):
            key_map[f"text_encoders.transformer.{path}"] = whole
            index = 1 + ("clip_g" in clips) + ("clip_l" in clips)
            flat = path.replace(".", "_")
            key_map[f"lora_te{index}_{flat}"] = whole
            if index == 2:  # OneTrainer's FLUX.1 T5 names, and kohya's after them
                key_map[f"lora_te3_{flat}"] = whole
            continue
        if path == "text_projection":
            names = {"clip_g": ("lora_prior_te_", "lora_te2_"), "clip_l": ("lora_te1_",)}
            for head in names.get(clip, ()):
                key_map[f"{head}text_projection"] = whole
            continue
        match = _CLIP_LAYER.fullmatch(path)
        if match is None or int(match.group(1)) >= 32:
            continue
        flat = path.replace(".", "_")
        if clip in ("clip_h", "clip_l"):
            heads = ("lora_te_", "lora_te1_")
            key_map[f"text_encoder.{path}"] = whole
        elif "clip_l" in clips:
            heads = ("lora_te2_",)
            key_map[f"text_encoder_2.{path}"] = whole
        else:
            heads = ("lora_te_", "lora_prior_te_")
            key_map[f"text_encoder.{path}"] = whole
        for head in heads:
            key_map[head + flat] = whole
    return key_map
