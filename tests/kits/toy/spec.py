"""Toy's models as data for the shared loader (library/models/families/spec_loader.py).

A "ToyPipeline" folder holds transformer/ (diffusers' BriaTransformer2DModel), vae/ (the
16-channel AutoencoderKL), text_encoder/ (a T5 encoder), tokenizer/ (T5's) and scheduler/. As
single files: the transformer in Toy's made-up original names (TABLE) or in diffusers' names,
with the [flow] t5xxl and ae files read by the shared readers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from library.models.families.file_plans import plan_ae16_file, plan_t5_file
from library.models.families.folder_loader import t5_tokenizer
from library.models.families.name_table import (
    DUAL_STREAM_BLOCK,
    SINGLE_STREAM_BLOCK,
    NameTable,
    count_numbered,
)
from library.models.families.spec import ComponentFile, FamilySpec, MainFile, SpecPart
from library.models.released_configs import t5_xxl_config
from library.models.text_encoders.t5 import T5_XXL_REPO, T5TokenizerPlaces

FAMILY = "Toy"
PIPELINE = "ToyPipeline"
PAIRS, SOLOS = "pair_blocks", "solo_blocks"  # the made-up original block lists
# Made-up original names: the shared dual/single-stream stems, the blocks' modulation Linears
# and a few top-level stems of Toy's own.
TABLE = NameTable(
    top={
        "patch_in": "x_embedder",
        "text_in": "context_embedder",
        "clock.in_layer": "time_embed.timestep_embedder.linear_1",
        "clock.out_layer": "time_embed.timestep_embedder.linear_2",
        "head.modulation": "norm_out.linear",
        "head.linear": "proj_out",
    },
    lists=(
        (PAIRS, "transformer_blocks",
         {**DUAL_STREAM_BLOCK, "img_mod.lin": "norm1.linear", "txt_mod.lin": "norm1_context.linear"}),
        (SOLOS, "single_transformer_blocks", {**SINGLE_STREAM_BLOCK, "modulation.lin": "norm.linear"}),
    ),
    model="BriaTransformer2DModel",
    width_key="patch_in.weight",
)  # fmt: skip
T5_PLACES = T5TokenizerPlaces(
    repos=(T5_XXL_REPO,), sub="tokenizer", copy_from="google/t5-v1_1-xxl's tokenizer files"
)


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """BriaTransformer2DModel kwargs for diffusers-named shapes."""
    width, in_channels = shapes["x_embedder.weight"]
    head_dim = shapes["transformer_blocks.0.attn.norm_q.weight"][0]
    return {
        "patch_size": 1,
        "in_channels": in_channels,
        "num_layers": count_numbered(shapes, "transformer_blocks"),
        "num_single_layers": count_numbered(shapes, "single_transformer_blocks"),
        "attention_head_dim": head_dim,
        "num_attention_heads": width // head_dim,
        "joint_attention_dim": shapes["context_embedder.weight"][1],
        # the rotary axes show in no shape: Toy's are a quarter, then three eighths twice
        "axes_dims_rope": (head_dim // 4, head_dim * 3 // 8, head_dim * 3 // 8),
    }


SPEC = FamilySpec(
    family=FAMILY,
    pipeline=PIPELINE,
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:BriaTransformer2DModel",
            main=MainFile(
                names=TABLE,
                original_marks=("patch_in.weight", f"{PAIRS}.0.img_attn.qkv.weight"),
                diffusers_marks=("x_embedder.weight", "transformer_blocks.0.norm1.linear.weight",
                                 "time_embed.timestep_embedder.linear_1.weight"),
                config_from_shapes=transformer_config_from_shapes,
                damaged=re.compile(rf'"(model\.diffusion_model\.)?{PAIRS}\.'),
                example="toy.safetensors",
            ),
        ),
        SpecPart(
            "vae", "vae", "diffusers:AutoencoderKL",
            file=ComponentFile(
                "ae", "[flow]", "the 16-channel autoencoder (ae.safetensors)",
                lambda file: plan_ae16_file(file, "ae", "Toy vae", FAMILY),
            ),
        ),
        SpecPart(
            "text_encoder", "text_encoder", "transformers:T5EncoderModel", base=t5_xxl_config,
            file=ComponentFile(
                "t5xxl", "[flow]", "the T5 text encoder",
                lambda file: plan_t5_file(file, "t5xxl", "text_encoder_2", "Toy text_encoder"),
            ),
        ),
    ),
    tokenizers=(t5_tokenizer("tokenizer", "text_encoder", T5_PLACES.find, T5_PLACES.missing),),
)  # fmt: skip
