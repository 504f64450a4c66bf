"""Krea 2 from its single files: the transformer (pretrained_model_name_or_path, musubi-tuner's
--dit: Krea's raw.safetensors / turbo.safetensors in the original names, bare or under
ComfyUI's ``model.diffusion_model.``, or a file in diffusers' names), the Qwen3-VL text encoder
([flow] text_encoder: Comfy-Org's qwen3vl_4b_bf16.safetensors, transformers' names), the VAE
([model] vae: qwen_image_vae.safetensors) and the tokenizer from tokenizer_path. A file does
not say whether it is RAW or Turbo: [flow] dit_variant does (unset: raw). Each file's config is
its header's (difftune's full fine-tunes write one), else read off its shapes (the transformer)
or the released one; every tensor is checked before any weight is read."""

from __future__ import annotations

import inspect
import re

from library.errors import ModelError
from library.models import shape_configs
from library.models.families import qwen3_vl_file, wan_vae_file
from library.models.families.file_contents import sample_keys
from library.models.families.file_plans import (
    family_component_file,
    load_plan,
    open_safetensors,
    plan_part,
    refuse_scaled_fp8,
)
from library.models.families.krea2 import spec
from library.models.families.local_tokenizer import load_local_tokenizer
from library.models.loader import offline

FAMILY = "Krea 2"
FILES = {
    "text_encoder": ("[flow]", "the Qwen3-VL text encoder (qwen3vl_4b_bf16.safetensors)"),
    "vae": ("[model]", "the Qwen-Image VAE (qwen_image_vae.safetensors)"),
}
TOKENIZER_WHERE = "a Krea 2 folder's tokenizer/ (Qwen3-VL-4B-Instruct's)"


def load_krea2_files(path, model, flow, weight_dtype, vae_dtype) -> tuple[dict, object]:
    """(modules by folder part name, tokenizer) of the transformer file ``path`` and its
    component files."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    transformer = plan_transformer(open_safetensors(path, "pretrained_model_name_or_path", FAMILY))
    text_encoder = plan_component("text_encoder", flow.text_encoder)
    vae = plan_component("vae", model.vae)
    vocab = text_encoder.config["text_config"]["vocab_size"]
    tokenizer = load_local_tokenizer(model.tokenizer_path, vocab, path, "Qwen3-VL", TOKENIZER_WHERE)
    with offline():
        modules = {
            "transformer": load_plan(transformer, weight_dtype),
            "text_encoder": load_plan(text_encoder, weight_dtype),
            "vae": load_plan(vae, vae_dtype),
        }
    return modules, tokenizer


def plan_component(key: str, value: str | None):
    """The plan of [flow] text_encoder's or [model] vae's file."""
    section, what = FILES[key]
    file = family_component_file(value, key, section, what, FAMILY)
    if key == "vae":
        return wan_vae_file.plan_vae(file, key, what, _released_vae, "Qwen-Image VAE")
    return qwen3_vl_file.plan_qwen3_vl(file, key, what)


def plan_transformer(file):
    """The transformer in the original names (Krea's, ComfyUI's) or diffusers'."""
    what = "pretrained_model_name_or_path"
    refuse_scaled_fp8(file, what)
    if spec.detect_krea2(file.keys()) is None:
        raise ModelError(
            f"{file.path} holds no Krea 2 transformer ({sample_keys(file.keys())}); point "
            "pretrained_model_name_or_path at raw.safetensors (krea/Krea-2-Raw) or a folder"
        )
    keys = list(file.keys())
    diffusers = any(k.startswith("text_fusion.") for k in keys)
    convert = dict if diffusers else spec.state_from_original
    misfit = lambda exc: ModelError(f"{what} = {file.path}: it lacks {exc}; re-download it")  # noqa: E731
    return plan_part("transformer", what, file, keys, convert, _build_transformer,
                     transformer_config, misfit, label="Krea 2 transformer")  # fmt: skip


def transformer_config(plain) -> dict:
    """Krea2Transformer2DModel kwargs for diffusers-named shapes (KeyError naming a key the
    sizes are read from); the rotary split is the released one, or its proportions."""

    def count(part: str) -> int:
        return 1 + max(int(m[1]) for k in plain if (m := re.match(part + r"\.(\d+)\.", k)))

    width, in_channels = plain["img_in.weight"]
    head = plain["transformer_blocks.0.attn.norm_q.weight"][0]
    text = plain["txt_in.linear_1.weight"][1]
    fusion = "text_fusion.layerwise_blocks.0."
    text_head = plain[fusion + "attn.norm_q.weight"][0]
    config = {
        "in_channels": in_channels, "num_layers": count("transformer_blocks"),
        "attention_head_dim": head, "num_attention_heads": width // head,
        "num_key_value_heads": plain["transformer_blocks.0.attn.to_k.weight"][0] // head,
        "intermediate_size": plain["transformer_blocks.0.ff.gate.weight"][0],
        "timestep_embed_dim": plain["time_embed.linear_1.weight"][1], "text_hidden_dim": text,
        "num_text_layers": plain["text_fusion.projector.weight"][1],
        "text_num_attention_heads": text // text_head,
        "text_num_key_value_heads": plain[fusion + "attn.to_k.weight"][0] // text_head,
        "text_intermediate_size": plain[fusion + "ff.gate.weight"][0],
        "num_layerwise_text_blocks": count("text_fusion.layerwise_blocks"),
        "num_refiner_text_blocks": count("text_fusion.refiner_blocks"),
        "axes_dims_rope": (32, 48, 48),
    }  # fmt: skip
    shape_configs.fitted_rotary_axes(config, head, "Krea 2 transformer")
    return config


def _build_transformer(config):
    from diffusers import Krea2Transformer2DModel

    return Krea2Transformer2DModel(**config)


def _released_vae() -> dict:
    """The Qwen-Image VAE's config: diffusers' AutoencoderKLQwenImage defaults are it."""
    from diffusers import AutoencoderKLQwenImage

    parameters = inspect.signature(AutoencoderKLQwenImage.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
