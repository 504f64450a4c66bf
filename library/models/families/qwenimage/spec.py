"""Qwen-Image's models as data for the shared loader (library/models/families/spec_loader.py).

A diffusers QwenImagePipeline folder (Qwen/Qwen-Image) holds transformer/, vae/, text_encoder/
(Qwen2.5-VL), tokenizer/ and scheduler/. As the single files Comfy-Org distributes
(Comfy-Org/Qwen-Image_ComfyUI and Qwen-Image-Edit_ComfyUI, ``split_files/``):

- the transformer (pretrained_model_name_or_path, musubi-tuner's --dit;
  ``diffusion_models/qwen_image_bf16.safetensors``, also ``_fp8_e4m3fn`` and the edit releases'
  ``qwen_image_edit[_2509|_2511]_bf16``) in diffusers' own names (the original repository's are
  the same: its name table renames nothing), without a prefix or under
  ``model.diffusion_model.``; plain fp8 weights are cast to the weight dtype, ComfyUI's scaled
  fp8 weights dequantized first (checkpoint_file.py);
- the Qwen2.5-VL text encoder ([flow] text_encoder, ``text_encoders/qwen_2.5_vl_7b.safetensors``)
  and the VAE ([model] vae, ``vae/qwen_image_vae.safetensors``, or a folder's vae/ file), read
  by the shared readers of those parts (qwen_vl_file.py, wan_vae_file.py);
- the Qwen2.5-VL tokenizer from tokenizer_path.

With a folder, those keys replace its text_encoder/ and vae/. The edit releases
(qwenimage_edit/) are this spec with their pipeline, a processor and a fixed config flag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from library.errors import ModelError
from library.models import shape_configs
from library.models.families.folder_loader import CheckedFolder
from library.models.families.local_tokenizer import tokenizer_part
from library.models.families.name_table import NameTable, count_numbered
from library.models.families.qwen_vl_file import QWEN25_VL, text_encoder_part
from library.models.families.qwenimage import shapes
from library.models.families.spec import FamilySpec, MainFile, SpecPart
from library.models.families.spec_loader import claimer
from library.models.families.wan_vae_file import video_vae_part
from library.models.model_files import read_json

BLOCKS = "transformer_blocks"
# The file names are diffusers': the table renames nothing, its numbered list is what a
# streamed save (and a load) converts one block at a time.
TABLE = NameTable(
    top={}, lists=((BLOCKS, BLOCKS, {}),), model="QwenImageTransformer2DModel",
    same_elsewhere=True,
)  # fmt: skip
# config key -> what it names, for messages
COMPONENT_FILES = {
    "text_encoder": "the Qwen2.5-VL text encoder (qwen_2.5_vl_7b.safetensors)",
    "vae": "the VAE (qwen_image_vae.safetensors)",
}
TOKENIZER_WHERE = "a Qwen-Image diffusers folder's tokenizer/, or Qwen/Qwen-Image's"
# Qwen-Image's dual-stream blocks modulate each stream by its own Linear (img_mod / txt_mod),
# names no other family's transformer has.
MARKS = (f"{BLOCKS}.0.img_mod.",)


def transformer_config(plain: Mapping[str, tuple[int, ...]]) -> dict:
    """QwenImageTransformer2DModel kwargs for diffusers-named shapes (KeyError naming a key the
    sizes are read from when it is missing). The rotary split of the head is not stored: the
    released one, or its proportions for another head width."""
    base = shapes.transformer_config()
    width, in_channels = plain["img_in.weight"]
    head_dim = plain[f"{BLOCKS}.0.attn.norm_q.weight"][0]
    patch = base["patch_size"]
    config = {
        **base,
        "in_channels": in_channels,
        "out_channels": plain["proj_out.weight"][0] // (patch * patch),
        "num_layers": count_numbered(plain, BLOCKS),
        "attention_head_dim": head_dim,
        "num_attention_heads": width // head_dim,
        "joint_attention_dim": plain["txt_in.weight"][1],
    }
    shape_configs.fitted_rotary_axes(config, head_dim, "Qwen-Image transformer")
    return config


def inspect(checked) -> dict:
    """The sampling scheduler config: a folder's, else the released one (beside single files,
    Qwen2.5-VL's states are checked to be as wide as the transformer's caption input first)."""
    if isinstance(checked, CheckedFolder):
        return read_json(checked.model_dir / "scheduler" / "scheduler_config.json")
    check_caption_width(checked.plans["transformer"], checked.plans["text_encoder"])
    return shapes.scheduler_config()


def check_caption_width(transformer, text_encoder) -> None:
    """Qwen2.5-VL's states (its plan's) are as wide as the transformer's caption input."""
    width = text_encoder.config["text_config"]["hidden_size"]
    takes = transformer.config["joint_attention_dim"]
    if width != takes:
        raise ModelError(
            f"text_encoder = {text_encoder.file.path} is {width} wide and the transformer of "
            f"{transformer.file.path} takes {takes}-wide caption states; set text_encoder in "
            "[flow] to Qwen-Image's Qwen2.5-VL file (qwen_2.5_vl_7b.safetensors)"
        )


SPEC = FamilySpec(
    family="Qwen-Image",
    pipeline="QwenImagePipeline",
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:QwenImageTransformer2DModel",
            label="Qwen-Image transformer",
            main=MainFile(
                names=TABLE,
                original_marks=MARKS,  # the same names: found as diffusers' first
                diffusers_marks=MARKS,
                config_from_shapes=transformer_config,
                damaged=re.compile(r'"(model\.diffusion_model\.)?transformer_blocks\.\d+\.(img|txt)_mod\.'),
                example="qwen_image_bf16.safetensors",
            ),
        ),
        video_vae_part(COMPONENT_FILES["vae"], "Qwen-Image VAE"),
        text_encoder_part(QWEN25_VL, COMPONENT_FILES["text_encoder"]),
    ),
    tokenizers=(tokenizer_part("Qwen2.5-VL", TOKENIZER_WHERE),),
    inspect=inspect,
    other={"scheduler": "scheduler_config.json"},
)  # fmt: skip
# True for a QwenImagePipeline folder (or one whose transformer is Qwen-Image's), or a
# .safetensors file of a Qwen-Image transformer (an edit release's, by model_version, is claimed
# by its own family first)
claims_qwenimage = claimer(SPEC)


def release_spec(spec: FamilySpec, **fixed) -> FamilySpec:
    """``spec`` with a transformer file's config values ``fixed`` (what a release's file does
    not say, such as Qwen-Image-Edit-2511's zero_cond_t)."""
    part = spec.denoiser
    main = replace(part.main, fixed=fixed)
    return replace(spec, parts=tuple(replace(p, main=main) if p is part else p for p in spec.parts))
