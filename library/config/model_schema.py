"""The [model] section: the base model and how its text and latents are read."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.section import Section


class ModelSection(Section):
    pretrained_model_name_or_path: str = Field(
        description="The base model, local: a diffusers folder (model_index.json, unet/, vae/, "
        "text_encoder/, tokenizer/, scheduler/) or a single-file checkpoint in the original "
        "Stability layout (.safetensors; .ckpt is read weights-only, never running pickled "
        "code, and refused if it needs any). SD 1.x, 2.x and SDXL base are recognised from the "
        "keys. Nothing is downloaded."
    )
    v2: bool | None = Field(
        None,
        description="The model is SD 2.x. Unset: detected from the model (cross-attention width "
        "1024; for a single file, its OpenCLIP text encoder).",
    )
    v_parameterization: bool | None = Field(
        None,
        description="Train with the v-prediction target (SD 2.x 768-v). Unset: taken from the "
        "model's scheduler config (prediction_type); for a single file from its "
        "modelspec.prediction_type metadata, else epsilon (with a note for SD 2.x files).",
    )
    tokenizer_path: str | None = Field(
        None,
        description="A folder with the CLIP tokenizer files (vocab.json + merges.txt, e.g. those "
        "of openai/clip-vit-large-patch14), or with tokenizer/ and tokenizer_2/ subfolders. All "
        "SD text encoders share this vocabulary. Unset: a diffusers folder's own tokenizers; "
        "for a single-file model tokenizer_cache_dir, then the local Hugging Face cache. Each "
        "tokenizer is checked against its text encoder's config (kind, vocabulary, special "
        "tokens).",
    )
    tokenizer_cache_dir: str | None = Field(
        None,
        description="kohya's tokenizer cache folder, read only: tokenizer files in subfolders "
        "named after their Hub repo (openai_clip-vit-large-patch14, "
        "stabilityai_stable-diffusion-2, laion_CLIP-ViT-bigG-14-laion2B-39B-b160k).",
    )
    vae: str | None = Field(
        None,
        description="Use this VAE instead of the model's: a .safetensors (or .ckpt) file in the "
        "original or the diffusers key layout, or a diffusers VAE folder.",
    )
    no_half_vae: bool = Field(
        False,
        description="Keep the VAE in float32 under fp16/bf16 mixed precision (SDXL's VAE "
        "overflows in fp16).",
    )
    clip_skip: int | None = Field(
        None,
        ge=1,
        description="SD 1.x/2.x: condition on the N-th text-encoder layer from the end (with the "
        "final layer norm), as kohya and A1111 count: 1 is the last layer (the default), 2 the "
        "one before. SDXL always uses its penultimate layers.",
    )
    max_token_length: Literal[75, 150, 225] | None = Field(
        None,
        description="Longest caption in tokens: 150 or 225 encode it in 75-token windows "
        "(kohya's long-caption scheme). Unset: 75.",
    )
    zero_terminal_snr: bool = Field(
        False,
        description="Rescale the noise schedule so the last timestep is pure noise (zero "
        "terminal SNR, Lin et al. 2023). Needs v-prediction: with epsilon the last step has "
        "nothing to learn and samplers divide by zero there, so it is refused.",
    )
