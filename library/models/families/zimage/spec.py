"""Z-Image's models as data for the shared loader (library/models/families/spec_loader.py).

A diffusers ZImagePipeline folder (Tongyi-MAI/Z-Image or Z-Image-Turbo) holds transformer/,
vae/, text_encoder/ (Qwen3), tokenizer/ and scheduler/. As the single files Comfy-Org
distributes (``split_files/``): the transformer (pretrained_model_name_or_path) in the original
names (keys.py; full checkpoints under ``model.diffusion_model.``, diffusers' names read too),
the Qwen3-4B text encoder ([flow] text_encoder, musubi-tuner's --text_encoder; files.py) and
FLUX.1's 16-channel AE ([model] vae, musubi-tuner's --vae; a diffusers VAE folder or a .ckpt
too), with the Qwen3 tokenizer from tokenizer_path. With a folder, those keys replace its
text_encoder/ and vae/. The variant (Turbo or Base: the sampling shift) is the folder's
scheduler, or a transformer file's header scheduler, else its file name (files.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial

from library.errors import ModelError
from library.models import shape_configs
from library.models.families.file_plans import plan_ae16_file
from library.models.families.folder_loader import CheckedFolder, FolderTokenizer
from library.models.families.name_table import count_numbered
from library.models.families.shape_origins import convert_shapes
from library.models.families.spec import ComponentFile, FamilySpec, MainFile, SpecPart
from library.models.families.spec_loader import claimer
from library.models.families.zimage import files
from library.models.families.zimage.keys import DROPPED, TABLE
from library.models.families.zimage.shapes import transformer_config
from library.models.model_files import read_json


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """ZImageTransformer2DModel kwargs for diffusers-named shapes: the released config with
    every size the tensors show; the rotary split of the head width (``axes_dims``) does not
    show: the released one where it fits, else the same proportions (a guess, noted)."""
    original = convert_shapes(TABLE.to_original, shapes)
    base = transformer_config()
    dim, patch_width = original["x_embedder.weight"]
    head_dim = original["layers.0.attention.q_norm.weight"][0]
    config = {
        **base,
        "in_channels": patch_width
        // (base["all_patch_size"][0] ** 2 * base["all_f_patch_size"][0]),
        "dim": dim,
        "n_layers": count_numbered(original, "layers"),
        "n_refiner_layers": count_numbered(original, "noise_refiner"),
        "n_heads": dim // head_dim,
        "n_kv_heads": dim // head_dim,  # q, k and v are equal thirds of the fused qkv
        "cap_feat_dim": original["cap_embedder.1.weight"][1],
    }
    if sum(base["axes_dims"]) != head_dim:
        # 3/8 of each head to rows and to columns (48 of 128), the rest to the caption index
        side = 2 * (head_dim * 3 // 16)
        config["axes_dims"] = [head_dim - 2 * side, side, side]
        shape_configs.note_guesses("Z-Image transformer", config, ("axes_dims",))
    return config


def inspect(checked) -> dict:
    """The sampling scheduler config of the model's variant; beside single files, Qwen3's states
    are checked to be as wide as the transformer's caption input first."""
    if not isinstance(checked, CheckedFolder):
        files.check_caption_width(checked.plans["transformer"], checked.plans["text_encoder"])
        return files.file_scheduler(checked.plans["transformer"].file)
    scheduler = read_json(checked.model_dir / "scheduler" / "scheduler_config.json")
    if scheduler.get("use_dynamic_shifting"):
        raise ModelError(
            f"{checked.model_dir / 'scheduler'} asks for a resolution-dependent shift; the "
            "released Z-Image schedulers use a static one (shift 3.0 Turbo, 6.0 Base)"
        )
    return scheduler


def _files_tokenizer(checked):
    config = checked.part_config("text_encoder")
    return files.load_qwen3_tokenizer(checked.model.tokenizer_path, config, checked.model_dir)


SPEC = FamilySpec(
    family="Z-Image (Base or Turbo)",
    pipeline="ZImagePipeline",
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:ZImageTransformer2DModel",
            label="Z-Image transformer",
            main=MainFile(
                names=TABLE,
                original_marks=("noise_refiner.",),  # a refiner block only Z-Image has
                diffusers_marks=("noise_refiner.", "all_x_embedder."),
                config_from_shapes=transformer_config_from_shapes,
                damaged=re.compile(r'"(model\.diffusion_model\.)?(noise|context)_refiner\.\d+\.'),
                example="z_image_turbo_bf16.safetensors",
                dropped=DROPPED,
            ),
        ),
        SpecPart(
            "vae", "vae", "diffusers:AutoencoderKL",
            file=ComponentFile(
                "vae", "[model]", files.COMPONENT_FILES["vae"][1],
                lambda file: plan_ae16_file(file, "vae", "Z-Image vae", "Z-Image", "[model]"),
                other=lambda path: partial(files.load_vae_option, path),
            ),
        ),
        SpecPart(
            "text_encoder", "text_encoder", "transformers:Qwen3Model",
            file=ComponentFile(
                "text_encoder", "[flow]", files.COMPONENT_FILES["text_encoder"][1],
                files.plan_text_encoder,
            ),
        ),
    ),
    tokenizers=(FolderTokenizer("tokenizer", files.folder_tokenizer, read_files=_files_tokenizer),),
    inspect=inspect,
    other={"scheduler": "scheduler_config.json"},
)  # fmt: skip
claims_zimage = claimer(SPEC)
