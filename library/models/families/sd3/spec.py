"""SD3 / SD3.5's models as data for the shared loader (library/models/families/spec_loader.py).

A diffusers StableDiffusion3Pipeline folder holds transformer/, vae/, text_encoder/ (CLIP-L),
text_encoder_2/ (CLIP-G), text_encoder_3/ (T5-XXL) and their tokenizer/, tokenizer_2/,
tokenizer_3/. As single files: Stability AI's model file (pretrained_model_name_or_path) as it
ships it (sd3_medium.safetensors, sd3.5_medium / sd3.5_large.safetensors, the
``_incl_clips...`` files): the MMDiT under ``model.diffusion_model.`` (or without the prefix, or
a transformer file in diffusers' names), the VAE under ``first_stage_model.``, the text encoders
under ``text_encoders.{clip_l,clip_g,t5xxl}.transformer.`` in transformers' names. A [flow]
clip_l / clip_g / t5xxl file is used instead of the one inside, and with a folder replaces its
text encoder; a text encoder neither inside nor set is an error naming its key. The VAE is
[model] ``vae`` when set (a file, a diffusers VAE folder or a .ckpt), else the one inside, else
an error naming ``vae``; t5_tokenizer_path (tokenizer_path) replaces the T5 (CLIP) tokenizers.

Separate files: clip_l and clip_g in transformers' CLIPTextModelWithProjection names (with or
without ``text_model.``, or under their prefix in a full checkpoint), t5xxl in T5EncoderModel
names, a vae file in SD's LDM names or diffusers' (with or without ``first_stage_model.``). The
clip_l.safetensors Stability released with SD3 has no text_projection.weight: CLIP-L then gets
the identity projection, as Stability's reference code and ComfyUI give it. Each file's config
is the one in its metadata (``difftune.config.<part>``) when it fits, else the full-size SD3
config with the sizes the tensors show. What ``inspect`` finds is the variant ("sd3-medium",
"sd3.5-medium", "sd3.5-large"), after the channel and width checks.
"""

from __future__ import annotations

import logging
import re
from functools import partial
from pathlib import Path

import torch

from library.errors import ModelError
from library.models import original_names as names
from library.models.checkpoint_file import CheckpointFile
from library.models.families.file_contents import looks_like
from library.models.families.file_plans import (
    Plan,
    plan_autoencoder,
    plan_clip_encoder,
    plan_t5_encoder,
)
from library.models.families.folder_loader import clip_tokenizer, t5_tokenizer
from library.models.families.sd3 import shapes as sd3_shapes
from library.models.families.sd3.original_keys import (
    DIFFUSERS_MARKS,
    ORIGINAL_MARKS,
    TABLE,
    TEXT_ENCODER_PREFIXES,
    VAE_PREFIX,
    ae_from_original,
    transformer_config_from_shapes,
    variant_for,
)
from library.models.families.sd3.tokenizers import (
    find_sd3_t5_tokenizer_folder,
    missing_t5_tokenizer,
)
from library.models.families.spec import ComponentFile, FamilySpec, MainFile, SpecPart
from library.models.families.spec_loader import WHAT, claimer
from library.models.vae_file import load_vae

log = logging.getLogger(__name__)

FAMILY = "SD3 / SD3.5"
_VAE = "the SD3 VAE (16 latent channels)"
# [flow] key -> (its subfolder, what the file must be, how errors name the module, base config)
_ENCODERS = {
    "clip_l": (
        "text_encoder", "the CLIP-L text encoder (clip_l.safetensors)", "SD3 CLIP-L",
        sd3_shapes.clip_l_config,
    ),
    "clip_g": (
        "text_encoder_2", "the CLIP-G text encoder (clip_g.safetensors)", "SD3 CLIP-G",
        sd3_shapes.clip_g_config,
    ),
    "t5xxl": (
        "text_encoder_3", "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)", "SD3 T5-XXL",
        sd3_shapes.t5_xxl_config,
    ),
}  # fmt: skip
# Where the [model] and [flow] keys live, for the fix an error names.
_SECTION = {"vae": "[model]", "clip_l": "[flow]", "clip_g": "[flow]", "t5xxl": "[flow]"}
# Tensors of published CLIP files that CLIPTextModelWithProjection does not have: transformers
# 4.x's position_ids buffer, CLIP's logit scale.
_CLIP_UNUSED = ("position_ids", "logit_scale")


def _wrong_file(
    what: str, file: CheckpointFile, expected: str, problem: str, key: str
) -> ModelError:
    return ModelError(
        f"{what} = {file.path} is not {expected}: {problem} (the file looks like "
        f"{looks_like(file.keys())}); set {key} in {_SECTION[key]} to {expected}'s file"
    )


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import SD3Transformer2DModel

    # Buffers on the meta device too: the position table (0.9 GB in float32 for 3.5 Medium) is
    # computed at construction, and the file's own is loaded over it (its only buffer).
    with torch.device("meta"):
        return SD3Transformer2DModel.from_config(config)


# --- text encoders ------------------------------------------------------------------------------


def plan_encoder(file: CheckpointFile, what: str, key: str) -> Plan:
    """The text encoder ``key`` ("clip_l", "clip_g", "t5xxl") from ``file`` (named ``what`` in
    messages): under its prefix in a full checkpoint (a file cut out of one keeps it), else from
    the file's own keys."""
    inside = TEXT_ENCODER_PREFIXES[key]
    prefix = inside if any(k.startswith(inside) for k in file) else ""
    file.refuse_unreadable(what)
    part, expected, label, base = _ENCODERS[key]

    def wrong(problem: str) -> ModelError:
        return _wrong_file(what, file, expected, problem, key)

    if key == "t5xxl":
        return plan_t5_encoder(file, what, prefix, part, label, base(), wrong)
    keys = [k for k in file if k.startswith(prefix) and not k.endswith(_CLIP_UNUSED)]
    if not any(k.endswith("embeddings.token_embedding.weight") for k in keys):
        raise wrong(f"it has no {prefix}*embeddings.token_embedding.weight")
    identity = key == "clip_l" and prefix + "text_projection.weight" not in keys
    if identity:
        log.info(
            "%s %s has no text_projection.weight: CLIP-L's projection is the identity, as in "
            "Stability's reference code and ComfyUI",
            what,
            file.path.name,
        )

    def convert(state):
        out = names.with_text_model_prefix({k[len(prefix) :]: v for k, v in state.items()})
        if identity:
            embed = out["text_model.embeddings.token_embedding.weight"]
            width = embed.shape[1]
            out["text_projection.weight"] = torch.eye(width, dtype=embed.dtype, device=embed.device)
        return out

    return plan_clip_encoder(
        file, what, keys, part, label, base(), convert, _build_clip, wrong
    )  # fmt: skip


def _build_clip(config: dict) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(CLIPTextConfig(**config))


def _encoder_inside(key: str, file: CheckpointFile) -> Plan | None:
    """The text encoder ``key`` inside the model file, None when it holds none."""
    if not any(k.startswith(TEXT_ENCODER_PREFIXES[key]) for k in file):
        return None
    return plan_encoder(file, f"{WHAT} ({key} inside)", key)


def _encoder_part(key: str, cls: str) -> SpecPart:
    """The text encoder ``key``: its subfolder, or its [flow] file, or inside the model file."""
    sub, what, _label, base = _ENCODERS[key]
    file = ComponentFile(
        key, "[flow]", what, lambda file: plan_encoder(file, key, key),
        inside=partial(_encoder_inside, key),
    )  # fmt: skip
    return SpecPart("text_encoder", sub, cls, base=base, file=file)


# --- VAE ----------------------------------------------------------------------------------------


def plan_vae(file: CheckpointFile, what: str, prefixes: tuple[str, ...]) -> Plan:
    """The 16-channel VAE from the keys under the first of ``prefixes`` the file has, with SD3's
    latent scale and shift whatever the file's config says (they belong to the MMDiT)."""
    base = sd3_shapes.vae_config()
    return plan_autoencoder(
        file, what, prefixes, ae_from_original, base, "SD3 VAE",
        (sd3_shapes.LATENT_CHANNELS, "SD3's"),
        lambda problem: _wrong_file(what, file, _VAE, problem, "vae"),
        fixed={k: base[k] for k in ("scaling_factor", "shift_factor")},
    )  # fmt: skip


def _vae_inside(file: CheckpointFile) -> Plan | None:
    if not any(k.startswith(VAE_PREFIX) for k in file):
        return None
    return plan_vae(file, f"{WHAT} (its VAE)", (VAE_PREFIX,))


def _vae_folder(path: Path):
    """[model] vae as a diffusers VAE folder or a .ckpt (library.models.vae_file)."""
    if not path.exists():
        raise ModelError(f"vae = {path} does not exist; set vae in [model] to {_VAE}'s file")
    return lambda dtype: load_vae(str(path), sd3_shapes.vae_config(), dtype)


# --- the checks before loading ------------------------------------------------------------------


def refuse_channels(where: Path, channels: int) -> None:
    expected = sd3_shapes.LATENT_CHANNELS
    if channels != expected:
        raise ModelError(
            f"{where} takes {channels} input channels (an inpainting or control model?); only "
            f"text-to-image SD3 / SD3.5 models with {expected} (the VAE's latents) can be trained"
        )


def check_widths(
    path: Path, config: dict, clip_l: tuple[str, dict], clip_g: tuple[str, dict],
    t5: tuple[str, dict],
) -> None:  # fmt: skip
    """The encoders' outputs fit the transformer ``config`` (of ``path``): the two projected
    pooled outputs side by side, both CLIPs' states side by side within T5's width, T5's width.
    Each encoder is (how messages name it, its config)."""
    pooled = (clip_l[1]["projection_dim"], clip_g[1]["projection_dim"])
    widths = (clip_l[1]["hidden_size"], clip_g[1]["hidden_size"])
    context = config["joint_attention_dim"]
    if sum(pooled) != config["pooled_projection_dim"] or sum(widths) > context:
        raise ModelError(
            f"the CLIPs do not fit {path.name}: CLIP-L ({clip_l[0]}) is {widths[0]} wide with "
            f"{pooled[0]} pooled features, CLIP-G ({clip_g[0]}) {widths[1]} with {pooled[1]}, "
            f"the transformer takes {config['pooled_projection_dim']} pooled features and "
            f"{context}-wide text; set clip_l and clip_g in [flow] to SD3's CLIP-L and CLIP-G "
            "files"
        )
    if t5[1]["d_model"] != context:
        raise ModelError(
            f"{t5[0]} is {t5[1]['d_model']} wide, {path.name} takes {context}-wide T5 states; "
            "set t5xxl in [flow] to the T5-XXL file"
        )


def variant_of(checked) -> str:
    """The variant of the checked parts (a folder or the single files), after the transformer's
    channel check and the text encoders' widths against it."""
    config = checked.config
    where = checked.model_dir / "transformer" if checked.model_dir.is_dir() else checked.model_dir
    refuse_channels(where, config.get("in_channels", sd3_shapes.LATENT_CHANNELS))
    encoders = (part for part, *_ in _ENCODERS.values())
    check_widths(
        where, config, *((checked.part_source(s), checked.part_config(s)) for s in encoders)
    )
    return variant_for(bool(config.get("qk_norm")), bool(config.get("dual_attention_layers")))


_CLIP = "transformers:CLIPTextModelWithProjection"

SPEC = FamilySpec(
    family=FAMILY,
    pipeline="StableDiffusion3Pipeline",
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:SD3Transformer2DModel", label="SD3 transformer",
            main=MainFile(
                names=TABLE,
                original_marks=ORIGINAL_MARKS,
                diffusers_marks=DIFFUSERS_MARKS,
                config_from_shapes=transformer_config_from_shapes,
                # key names a damaged SD3 model file's header text shows (Stability's layout)
                damaged=re.compile(r'"(model\.diffusion_model\.)?joint_blocks\.\d+\.'),
                example="sd3_medium.safetensors, sd3.5_medium.safetensors, sd3.5_large.safetensors",
                others=(VAE_PREFIX, "text_encoders."),
                build=_build_transformer,
            ),
        ),
        SpecPart(
            "vae", "vae", "diffusers:AutoencoderKL",
            file=ComponentFile(
                "vae", "[model]", _VAE,
                lambda file: plan_vae(file, "vae", (VAE_PREFIX, "vae.")),
                other=_vae_folder, inside=_vae_inside,
            ),
        ),
        _encoder_part("clip_l", _CLIP),
        _encoder_part("clip_g", _CLIP),
        _encoder_part("t5xxl", "transformers:T5EncoderModel"),
    ),
    tokenizers=(
        clip_tokenizer("tokenizer", "clip", 0, "text_encoder", "CLIP-L"),
        clip_tokenizer("tokenizer_2", "openclip", 1, "text_encoder_2", "CLIP-G"),
        t5_tokenizer(
            "tokenizer_3", "text_encoder_3", find_sd3_t5_tokenizer_folder, missing_t5_tokenizer
        ),
    ),
    inspect=variant_of,
)  # fmt: skip


# True for a StableDiffusion3Pipeline folder (or one whose transformer is SD3's: the other SD3
# pipelines are refused by name), or a .safetensors file holding an SD3 / SD3.5 MMDiT (a damaged
# one by its header text); reads only model_index.json or the file's header.
claims_sd3 = claimer(SPEC)
