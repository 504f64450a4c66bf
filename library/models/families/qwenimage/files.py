"""Qwen-Image's own readers beside its spec (spec.py): the Qwen2.5-VL text encoder file, the VAE
file and the Qwen2.5-VL tokenizer, each checked before any weight is read.

As Comfy-Org distributes them (Comfy-Org/Qwen-Image_ComfyUI and Qwen-Image-Edit_ComfyUI,
``split_files/``), beside the transformer file (``diffusion_models/qwen_image_bf16.safetensors``,
also ``_fp8_e4m3fn`` and the edit releases' ``qwen_image_edit[_2509|_2511]_bf16``; plain fp8
weights are cast to the weight dtype, ComfyUI's scaled fp8 is refused by name):

- ``text_encoders/qwen_2.5_vl_7b.safetensors``: Qwen2_5_VLForConditionalGeneration in the
  transformers names of its release (``model.layers.*``, ``visual.*``, ``lm_head.weight``);
  files saved by current transformers (``model.language_model.*``, ``model.visual.*``) are read
  too;
- ``vae/qwen_image_vae.safetensors``: the VAE in Wan 2.1's names (library/models/wan_vae_keys.py);
  the VAE of a diffusers folder (``vae/diffusion_pytorch_model.safetensors``, diffusers' names) is
  read too.

Each file's config is the one in its header (``difftune.config.<part>``, which difftune's full
fine-tunes write) when it fits, else the released one; every tensor's name and shape is checked
against the module it fills before any weight is read.
"""

from __future__ import annotations

import torch

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families import wan_vae_file
from library.models.families.file_contents import looks_like
from library.models.families.file_plans import Plan, plan_part, refuse_scaled_fp8
from library.models.families.qwenimage import shapes
from library.models.families.wan_vae_file import stored_config

# config key -> what it names, for messages
COMPONENT_FILES = {
    "text_encoder": "the Qwen2.5-VL text encoder (qwen_2.5_vl_7b.safetensors)",
    "vae": "the VAE (qwen_image_vae.safetensors)",
}
TOKENIZER_WHERE = "a Qwen-Image diffusers folder's tokenizer/, or Qwen/Qwen-Image's"


# --- Qwen2.5-VL -------------------------------------------------------------------------------


def text_encoder_names(keys) -> dict[str, str]:
    """File key -> Qwen2_5_VLForConditionalGeneration's name, for either transformers layout
    (``model.layers.*`` and ``visual.*`` of the release, or current ``model.language_model.*``
    and ``model.visual.*``)."""
    out = {}
    for key in keys:
        if key.startswith(("model.language_model.", "model.visual.", "lm_head.")):
            out[key] = key
        elif key.startswith("model."):
            out[key] = "model.language_model." + key[len("model.") :]
        elif key.startswith("visual."):
            out[key] = "model." + key
        else:
            out[key] = key  # not a Qwen2.5-VL tensor: the fit check names it
    return out


def plan_text_encoder(file: CheckpointFile) -> Plan:
    """Qwen2.5-VL as Qwen2_5_VLForConditionalGeneration: the vision tower is read too (the edit
    models show it their reference images)."""
    what = "text_encoder"
    refuse_scaled_fp8(file, what)
    names = text_encoder_names(file.keys())
    embed = "model.language_model.embed_tokens.weight"
    if embed not in names.values() or not any("model.visual." in n for n in names.values()):
        raise ModelError(
            f"{what} = {file.path} is not {COMPONENT_FILES[what]}: it has no "
            f"{'model.embed_tokens.weight' if embed not in names.values() else 'visual.*'} "
            f"tensors (the file looks like {looks_like(file.keys())}); set {what} in [flow] "
            "to qwen_2.5_vl_7b.safetensors (bf16; its scaled fp8 file is not read)"
        )

    def convert(state):
        return {names[k]: v for k, v in state.items()}

    def released(plain) -> dict:
        # A header that does not fit stays the measure, so the error names the tensor that
        # differs from it; without one, the released sizes (and the file's vocabulary).
        config = stored_config(file, "text_encoder") or shapes.text_encoder_config()
        config["text_config"]["vocab_size"] = plain[embed][0]
        return config

    return plan_part(
        "text_encoder", what, file, list(file.keys()), convert, _build_qwen25vl, released,
        lambda exc: ModelError(f"{what} = {file.path}: it lacks {exc}; re-download it"),
        label="Qwen2.5-VL text encoder",
    )  # fmt: skip


def _build_qwen25vl(config: dict) -> torch.nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**config))


def check_caption_width(transformer: Plan, text_encoder: Plan) -> None:
    """Qwen2.5-VL's states are as wide as the transformer's caption input."""
    width = text_encoder.config["text_config"]["hidden_size"]
    takes = transformer.config["joint_attention_dim"]
    if width != takes:
        raise ModelError(
            f"text_encoder = {text_encoder.file.path} is {width} wide and the transformer of "
            f"{transformer.file.path} takes {takes}-wide caption states; set text_encoder in "
            "[flow] to Qwen-Image's Qwen2.5-VL file (qwen_2.5_vl_7b.safetensors)"
        )


# --- VAE --------------------------------------------------------------------------------------


def plan_vae(file: CheckpointFile) -> Plan:
    """The VAE in Wan 2.1's names (ComfyUI's file) or diffusers' (a folder's vae/ file)."""
    return wan_vae_file.plan_vae(
        file, "vae", COMPONENT_FILES["vae"], shapes.vae_config, "Qwen-Image VAE"
    )
