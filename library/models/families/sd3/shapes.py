"""SD3 / SD3.5 component configs as data: the full-size models (tiny ones of the same layout, for
the tests, are in tests/kits/sd3/tiny_shapes.py).

Every function returns a fresh dict of constructor kwargs:
``SD3Transformer2DModel(**transformer_config("sd3.5-large"))``, ``AutoencoderKL(**vae_config())``,
``CLIPTextModelWithProjection(CLIPTextConfig(**clip_l_config()))`` (and ``clip_g_config()``),
``T5EncoderModel(T5Config(**t5_xxl_config()))``.

Variants (difftune's names): "sd3-medium" (Stable Diffusion 3 Medium), "sd3.5-medium" and
"sd3.5-large".

Sources of the full-size numbers:
- [st] kohya-ss/sd-scripts: library/sd3_utils.py (``analyze_state_dict_state``: width 64 x depth
  with one 64-wide head per block, qk norm from ``attn.ln_k``, dual attention from
  ``x_block.attn2``, the position table side from ``pos_embed``; ``load_clip_l`` /
  ``load_clip_g``: both CLIP configs), library/sd3_models.py (the MMDiT: the last block's
  context stream is pre-only; the VAE's scale 1.5305 and shift 0.0609), library/strategy_sd3.py
  (T5 prompts of 256 tokens by default);
- [diffusers] diffusers 0.42.1: ``SD3Transformer2DModel`` (its argument list, and
  dual_attention_layers 0..12 for 3.5 Medium in its comments), single_file_utils
  (``infer_diffusers_model_type``: a 192 x 192 position table for SD3 Medium, 384 x 384 for 3.5
  Medium, 38 blocks for 3.5 Large), ``StableDiffusion3Pipeline`` (T5 max_sequence_length 256);
- [comfy] ComfyUI comfy/supported_models.py ``SD3`` (16 latent channels) and
  comfy/latent_formats.py ``SD3`` (scale 1.5305, shift 0.0609).
The T5-XXL encoder and CLIP-L are the ones FLUX.1 uses (library/models/families/flux/shapes.py),
here with CLIP-L's text projection. The tests check the parameter counts against published figures.
"""

from __future__ import annotations

from typing import Literal

from library.models.families.flux import shapes as flux_shapes

Variant = Literal["sd3-medium", "sd3.5-medium", "sd3.5-large"]
VARIANTS: tuple[Variant, ...] = ("sd3-medium", "sd3.5-medium", "sd3.5-large")

LATENT_CHANNELS = 16
PATCH_SIZE = 2  # [st] x_embedder.proj is a 2x2 stride-2 convolution
HEAD_DIM = 64  # [st] hidden_size = 64 * depth, num_heads = depth
POOLED_WIDTH = 768 + 1280  # CLIP-L's and CLIP-G's projected pooled outputs, concatenated
CLIP_MAX_LENGTH = 77
T5_MAX_LENGTH = 256  # [st] Sd3TokenizeStrategy's default; [diffusers] max_sequence_length
# [st] / [diffusers]: blocks; 3.5 Medium's first 13 blocks add a second image self-attention.
DEPTH: dict[str, int] = {"sd3-medium": 24, "sd3.5-medium": 24, "sd3.5-large": 38}
DUAL_ATTENTION_LAYERS: dict[str, tuple[int, ...]] = {
    "sd3-medium": (),
    "sd3.5-medium": tuple(range(13)),
    "sd3.5-large": (),
}
# [diffusers] the side of the stored sin-cos position table, in patches.
POS_EMBED_MAX_SIZE: dict[str, int] = {"sd3-medium": 192, "sd3.5-medium": 384, "sd3.5-large": 192}
QK_NORM: dict[str, str | None] = {
    "sd3-medium": None,
    "sd3.5-medium": "rms_norm",
    "sd3.5-large": "rms_norm",
}


def _check(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown SD3 variant {variant!r}; expected one of {VARIANTS}")


# --- full size --------------------------------------------------------------------------------


def transformer_config(variant: Variant = "sd3.5-medium") -> dict:
    """SD3Transformer2DModel kwargs of the MMDiT of ``variant``."""
    _check(variant)
    depth = DEPTH[variant]
    return {
        "sample_size": 128,  # [diffusers] latent pixels of the default image; not in the weights
        "patch_size": PATCH_SIZE,
        "in_channels": LATENT_CHANNELS,
        "num_layers": depth,
        "attention_head_dim": HEAD_DIM,
        "num_attention_heads": depth,
        "joint_attention_dim": 4096,  # the T5-XXL width
        "caption_projection_dim": HEAD_DIM * depth,  # the context stream has the image's width
        "pooled_projection_dim": POOLED_WIDTH,
        "out_channels": LATENT_CHANNELS,
        "pos_embed_max_size": POS_EMBED_MAX_SIZE[variant],
        "dual_attention_layers": DUAL_ATTENTION_LAYERS[variant],
        "qk_norm": QK_NORM[variant],
    }


def vae_config() -> dict:
    """AutoencoderKL kwargs of the SD3 VAE: FLUX.1's AE layout (16 latent channels, 8x down, no
    quant convs) with SD3's own latent scale and shift."""
    return {**flux_shapes.ae_config(), "scaling_factor": 1.5305, "shift_factor": 0.0609}


def clip_l_config() -> dict:
    """CLIPTextConfig kwargs of OpenAI CLIP ViT-L/14's text tower with its 768-wide projection
    (SD3 takes the projected pooled output: CLIPTextModelWithProjection)."""
    return flux_shapes.clip_l_config()


def clip_g_config() -> dict:
    """CLIPTextConfig kwargs of OpenCLIP ViT-bigG/14's text tower with its projection. [st]"""
    return {
        "vocab_size": 49408,
        "hidden_size": 1280,
        "intermediate_size": 5120,
        "num_hidden_layers": 32,
        "num_attention_heads": 20,
        "max_position_embeddings": CLIP_MAX_LENGTH,
        "hidden_act": "gelu",  # OpenCLIP's exact GELU, not OpenAI CLIP's quick-GELU
        "layer_norm_eps": 1e-5,
        "projection_dim": 1280,
        # eos_token_id 2 makes transformers pool at the highest token id (argmax), the end token.
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 1,
    }


def t5_xxl_config() -> dict:
    """T5Config kwargs of google/t5-v1_1-xxl's encoder, as FLUX.1 uses it."""
    return flux_shapes.t5_xxl_config()
