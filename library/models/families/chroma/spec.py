"""Chroma's models as data for the shared loader (library/models/families/spec_loader.py).

A diffusers ChromaPipeline folder (lodestones/Chroma1-HD, Chroma1-Base) holds transformer/,
vae/, text_encoder/ (T5-XXL), tokenizer/ (T5's) and scheduler/. As single files: the
transformer (pretrained_model_name_or_path) as lodestones and ComfyUI ship it (original names,
original_keys.py, optionally under ``model.diffusion_model.``) or in diffusers' names, with the
[flow] t5xxl and ae files (the T5-XXL encoder and the 16-channel AE, read by the shared readers);
with a folder, those keys replace its text_encoder/ and vae/, t5_tokenizer_path its tokenizer.
The transformer's config is the header's (``difftune.config.transformer``) when it fits, else
the released one with the sizes the tensors show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from library.errors import ModelError
from library.models import shape_configs
from library.models.families.chroma.original_keys import GUIDANCE, TABLE
from library.models.families.chroma.shapes import transformer_config
from library.models.families.file_plans import plan_ae16_file, plan_t5_file
from library.models.families.folder_loader import t5_tokenizer
from library.models.families.name_table import count_numbered, dual_single_sizes
from library.models.families.spec import ComponentFile, FamilySpec, MainFile, SpecPart
from library.models.families.spec_loader import claimer
from library.models.released_configs import t5_xxl_config
from library.models.text_encoders.t5 import T5_XXL_PLACES

FAMILY = "Chroma"


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """ChromaTransformer2DModel kwargs for diffusers-named shapes: the released config with the
    widths and counts the tensors show. The rotary axes do not show: (16, 56, 56) when they fit
    the head width, else a guess in the same proportions (with a warning)."""
    sizes, out_channels = dual_single_sizes(shapes), shapes["proj_out.weight"][0]
    hidden, channels = shapes[f"{GUIDANCE}.in_proj.weight"]
    config = {
        **transformer_config(),
        **sizes,
        "out_channels": None if out_channels == sizes["in_channels"] else out_channels,
        "approximator_num_channels": channels,
        "approximator_hidden_dim": hidden,
        "approximator_layers": count_numbered(shapes, f"{GUIDANCE}.layers"),
    }
    shape_configs.fitted_rotary_axes(config, sizes["attention_head_dim"], "transformer")
    return config


def check_t5_width(checked) -> None:
    """T5's states are as wide as the transformer's text input."""
    t5_width = checked.part_config("text_encoder")["d_model"]
    width = {**transformer_config(), **checked.config}["joint_attention_dim"]
    if t5_width != width:
        raise ModelError(
            f"{checked.part_source('text_encoder')} is {t5_width} wide and the transformer of "
            f"{checked.model_dir} takes {width}-wide T5-XXL output; set t5xxl in [flow] to "
            "T5-XXL's file"
        )


SPEC = FamilySpec(
    family=FAMILY,
    pipeline="ChromaPipeline",
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:ChromaTransformer2DModel",
            main=MainFile(
                names=TABLE,
                original_marks=(f"{GUIDANCE}.in_proj.weight", "double_blocks.0.img_attn.qkv.weight"),
                diffusers_marks=(
                    f"{GUIDANCE}.in_proj.weight", "transformer_blocks.0.attn.add_q_proj.weight",
                ),
                config_from_shapes=transformer_config_from_shapes,
                damaged=re.compile(rf'"(model\.diffusion_model\.)?{GUIDANCE}\.'),
                example="Chroma1-HD.safetensors",
            ),
        ),
        SpecPart(
            "vae", "vae", "diffusers:AutoencoderKL",
            file=ComponentFile(
                "ae", "[flow]", "the autoencoder (FLUX.1's ae.safetensors)",
                lambda file: plan_ae16_file(file, "ae", "Chroma vae", FAMILY),
            ),
        ),
        SpecPart(
            "text_encoder", "text_encoder", "transformers:T5EncoderModel", base=t5_xxl_config,
            # t5xxl files carry their header config under FLUX.1's name for its T5
            file=ComponentFile(
                "t5xxl", "[flow]", "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)",
                lambda file: plan_t5_file(file, "t5xxl", "text_encoder_2", "Chroma text_encoder"),
            ),
        ),
    ),
    tokenizers=(t5_tokenizer("tokenizer", "text_encoder", T5_XXL_PLACES.find, T5_XXL_PLACES.missing),),
    inspect=check_t5_width,
)  # fmt: skip


# True for a ChromaPipeline folder (or one whose transformer is Chroma's), or a .safetensors file
# of a Chroma transformer (a damaged one by its header text)
claims_chroma = claimer(SPEC)
