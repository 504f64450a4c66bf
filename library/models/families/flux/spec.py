"""FLUX.1's models as data for the shared loader (library/models/families/spec_loader.py).

A diffusers FluxPipeline folder holds transformer/, vae/, text_encoder/ (CLIP-L), tokenizer/,
text_encoder_2/ (T5-XXL) and tokenizer_2/. As single files: the transformer
(pretrained_model_name_or_path) as Black Forest Labs and ComfyUI ship it (original names,
original_keys.py, optionally under ``model.diffusion_model.``) or in diffusers' names, with the
[flow] clip_l (transformers' CLIPTextModel names, with or without ``text_model.``), t5xxl and ae
files; with a folder, those keys replace its parts, t5_tokenizer_path (tokenizer_path) its T5
(CLIP) tokenizer. Each file's config is the header's (``difftune.config.<part>``) when it fits,
else the released one with the sizes the tensors show, so pruned and tiny models load too.
What ``inspect`` finds is the variant: "dev" (a guidance input) or "schnell".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from library.errors import ModelError
from library.models import original_names as names
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_plans import (
    Plan,
    plan_ae16_file,
    plan_clip_encoder,
    plan_t5_file,
    wrong_file,
)
from library.models.families.flux import shapes as flux_shapes
from library.models.families.flux.original_keys import DIFFUSERS_MARKS, ORIGINAL_MARKS, TABLE
from library.models.families.folder_loader import clip_tokenizer, t5_tokenizer
from library.models.families.name_table import dual_single_sizes
from library.models.families.spec import ComponentFile, FamilySpec, MainFile, SpecPart
from library.models.families.spec_loader import claimer
from library.models.text_encoders.t5 import T5_XXL_PLACES

FAMILY = "FLUX.1 (dev or schnell)"
PIPELINE = "FluxPipeline"
_GUIDANCE = "time_text_embed.guidance_embedder.linear_1.weight"


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """FluxTransformer2DModel kwargs for diffusers-named shapes: the released config of the
    variant (a guidance embedder: dev) with the sizes the tensors show. The rotary axes do not
    show: (16, 56, 56) when they fit the head width, else a guess in the same proportions."""
    sizes, out_channels = dual_single_sizes(shapes), shapes["proj_out.weight"][0]
    config = {
        **flux_shapes.transformer_config("dev" if _GUIDANCE in shapes else "schnell"),
        **sizes,
        "out_channels": None if out_channels == sizes["in_channels"] else out_channels,
        "pooled_projection_dim": shapes["time_text_embed.text_embedder.linear_1.weight"][1],
    }
    shape_configs.fitted_rotary_axes(config, sizes["attention_head_dim"], "transformer")
    return config


# Tensors of published clip_l files that CLIPTextModel does not have: transformers 4.x's
# position_ids buffer, the projection (FLUX.1 takes the pooled output without it), CLIP's logit
# scale.
_CLIP_UNUSED = ("position_ids", "text_projection.weight", "logit_scale")


def plan_clip(file: CheckpointFile) -> Plan:
    """CLIP-L's text tower from the [flow] clip_l file (transformers' names)."""
    what, expected = "clip_l", "the CLIP-L text encoder"
    file.refuse_unreadable(what)
    keys = [k for k in file if not k.endswith(_CLIP_UNUSED)]

    def wrong(problem: str) -> ModelError:
        return wrong_file(what, file, expected, problem)

    if not any(k.endswith("embeddings.token_embedding.weight") for k in keys):
        raise wrong("it has no embeddings.token_embedding.weight")
    return plan_clip_encoder(
        file, what, keys, "text_encoder", "FLUX.1 text_encoder", flux_shapes.clip_l_config(),
        names.with_text_model_prefix, _build_clip, wrong,
    )  # fmt: skip


def _build_clip(config: dict):
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(**config))


def refuse_channels(where: Path, channels: int) -> None:
    expected = flux_shapes.transformer_config()["in_channels"]
    if channels != expected:
        raise ModelError(
            f"{where} takes {channels} input channels (FLUX.1 Fill or Depth?); only text-to-image "
            f"FLUX.1 models with {expected} (16 latent channels, 2x2 packed) can be trained"
        )


def variant_of(checked) -> str:
    """The variant of the checked parts, after the transformer's channel check and the text
    encoders' widths against it (CLIP-L's pooled output its pooled projection, T5's states its
    text input)."""
    folder = checked.model_dir.is_dir()
    where = checked.model_dir / "transformer" if folder else checked.model_dir
    refuse_channels(where, checked.config.get("in_channels", 64))
    variant = "dev" if checked.config.get("guidance_embeds", False) else "schnell"
    config = {**flux_shapes.transformer_config(variant), **checked.config}
    checks = (
        ("text_encoder", "clip_l", "hidden_size", "pooled_projection_dim", "CLIP-L"),
        ("text_encoder_2", "t5xxl", "d_model", "joint_attention_dim", "T5-XXL"),
    )
    for sub, key, width, takes, name in checks:
        encoder = checked.part_config(sub)[width]
        if encoder != config[takes]:
            raise ModelError(
                f"{checked.part_source(sub)} is {encoder} wide and the transformer of {where} "
                f"takes {config[takes]}-wide {name} output; set {key} in [flow] to FLUX.1's "
                f"{name} file"
            )
    return variant


SPEC = FamilySpec(
    family=FAMILY,
    pipeline=PIPELINE,
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:FluxTransformer2DModel",
            label="FLUX.1 transformer",
            main=MainFile(
                names=TABLE,
                original_marks=ORIGINAL_MARKS,
                diffusers_marks=DIFFUSERS_MARKS,
                config_from_shapes=transformer_config_from_shapes,
                damaged=re.compile(
                    r'"(model\.diffusion_model\.)?(double|single)_blocks\.\d+\.'
                    r'|"single_transformer_blocks\.\d+\.'
                ),
                example="flux1-dev/schnell.safetensors",
            ),
        ),
        SpecPart(
            "vae", "vae", "diffusers:AutoencoderKL",
            file=ComponentFile(
                "ae", "[flow]", "the autoencoder (ae.safetensors)",
                lambda file: plan_ae16_file(file, "ae", "FLUX.1 vae", "FLUX.1"),
            ),
        ),
        SpecPart(
            "text_encoder", "text_encoder", "transformers:CLIPTextModel",
            base=flux_shapes.clip_l_config,
            file=ComponentFile(
                "clip_l", "[flow]", "the CLIP-L text encoder (clip_l.safetensors)", plan_clip
            ),
        ),
        SpecPart(
            "text_encoder", "text_encoder_2", "transformers:T5EncoderModel",
            base=flux_shapes.t5_xxl_config,
            file=ComponentFile(
                "t5xxl", "[flow]", "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)",
                lambda file: plan_t5_file(file, "t5xxl", "text_encoder_2", "FLUX.1 text_encoder_2"),
            ),
        ),
    ),
    tokenizers=(
        clip_tokenizer("tokenizer", "clip", 0, "text_encoder", "CLIP-L"),
        t5_tokenizer("tokenizer_2", "text_encoder_2", T5_XXL_PLACES.find, T5_XXL_PLACES.missing),
    ),
    inspect=variant_of,
)  # fmt: skip


# True for a FluxPipeline folder (or one whose transformer is FLUX.1's: its Fill, Kontext, ...
# pipelines are refused by name), or a .safetensors file of a FLUX.1 transformer (a damaged one
# by its header text)
claims_flux = claimer(SPEC)
