"""FLUX.1 component configs as data: the full-size models and tiny ones of the same layout.

Every function returns a fresh dict of constructor kwargs:
``FluxTransformer2DModel(**transformer_config("dev"))``, ``AutoencoderKL(**ae_config())``,
``CLIPTextModel(CLIPTextConfig(**clip_l_config()))``, ``T5EncoderModel(T5Config(**t5_xxl_config()))``.

Sources of the full-size numbers:
- [bfl] the original model configs as kohya-ss/sd-scripts copies them from the FLUX repository
  (library/flux_models.py ``configs``: FluxParams and AutoEncoderParams for dev and schnell);
- [st] sd-scripts library/flux_utils.py (``load_clip_l``'s CLIP-L config, ``load_t5xxl``'s
  T5 v1.1 XXL config, and the T5 token lengths in flux_train.py);
- [diffusers] diffusers 0.42.1 ``FluxTransformer2DModel`` defaults, which equal [bfl] dev but
  for ``guidance_embeds``; the vae/config.json of the FLUX.1 repositories for the AE's
  diffusers-only fields (sample_size, force_upcast).
The tests check the resulting parameter counts against published figures and formulas.
"""

from __future__ import annotations

from typing import Literal

from library.models import released_configs
from library.models.tiny import tiny_text_config

Variant = Literal["dev", "schnell"]
VARIANTS: tuple[Variant, ...] = ("dev", "schnell")

LATENT_CHANNELS = 16  # [bfl] z_channels
PATCH_SIZE = 2  # latents are packed 2x2 into tokens: in_channels 64 = 16 * 2 * 2 ([bfl])
NUM_DOUBLE_BLOCKS = 19  # [bfl] depth
NUM_SINGLE_BLOCKS = 38  # [bfl] depth_single_blocks
CLIP_MAX_LENGTH = 77
# [st] flux_train.py: T5 prompts are padded to 512 tokens for dev and 256 for schnell (schnell
# was distilled with the shorter length).
T5_MAX_LENGTH: dict[str, int] = {"dev": 512, "schnell": 256}


def _check(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown FLUX.1 variant {variant!r}; expected one of {VARIANTS}")


# --- full size --------------------------------------------------------------------------------


def transformer_config(variant: Variant = "dev") -> dict:
    """FluxTransformer2DModel kwargs of FLUX.1 dev or schnell (schnell has no guidance input)."""
    _check(variant)
    return {
        "patch_size": 1,  # the 2x2 packing happens before the model; its own patch is 1
        "in_channels": LATENT_CHANNELS * PATCH_SIZE * PATCH_SIZE,
        "out_channels": None,  # = in_channels
        "num_layers": NUM_DOUBLE_BLOCKS,
        "num_single_layers": NUM_SINGLE_BLOCKS,
        "attention_head_dim": 128,  # [bfl] hidden_size 3072 / num_heads 24
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,  # [bfl] context_in_dim: the T5-XXL width
        "pooled_projection_dim": 768,  # [bfl] vec_in_dim: CLIP-L's pooled width
        "guidance_embeds": variant == "dev",  # [bfl] guidance_embed
        "axes_dims_rope": (16, 56, 56),  # [bfl] axes_dim, sums to the head dim 128
    }


def ae_config() -> dict:
    """AutoencoderKL kwargs of the FLUX.1 AE (ae.safetensors): 16 latent channels, 8x down, no
    quant convs ([bfl] AutoEncoderParams; library/models/released_configs.py, which later
    families that ship it share)."""
    return released_configs.ae16_config()


def clip_l_config() -> dict:
    """CLIPTextConfig kwargs of OpenAI CLIP ViT-L/14's text tower, as FLUX.1 uses it.

    FLUX.1 takes the pooled output (the final-norm hidden state at the end token), without the
    text projection; ``projection_dim`` is kept only because the published config has it.
    """
    return {
        "vocab_size": 49408,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": CLIP_MAX_LENGTH,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": 768,
        # [st] the published config's ids. eos_token_id 2 makes transformers pool at the
        # highest token id (argmax), which is the end token 49407 of CLIP's vocabulary.
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 1,
    }


def t5_xxl_config() -> dict:
    """T5Config kwargs of google/t5-v1_1-xxl, whose encoder (T5EncoderModel) FLUX.1 uses [st]
    (library/models/released_configs.py)."""
    return released_configs.t5_xxl_config()


# --- tiny -------------------------------------------------------------------------------------

# Distinct widths for every stream, so a mix-up of two inputs fails on a shape.
TINY_CLIP_WIDTH = 24  # pooled text: the transformer's pooled_projection_dim
TINY_T5_WIDTH = 48  # T5 hidden states: the transformer's joint_attention_dim
TINY_HEADS, TINY_HEAD_DIM = 2, 16  # transformer width 32
TINY_T5_VOCAB_SIZE = 128  # more rows than the tiny tokenizer has pieces, as in T5-XXL
TINY_SIZE = 64  # pixels; the tiny AE downsamples by 8 like the real one


def tiny_transformer_config(variant: Variant = "dev") -> dict:
    """FluxTransformer2DModel kwargs: 2 double + 2 single blocks at width 32, real in/out."""
    return {
        **transformer_config(variant),
        "num_layers": 2,
        "num_single_layers": 2,
        "attention_head_dim": TINY_HEAD_DIM,
        "num_attention_heads": TINY_HEADS,
        "joint_attention_dim": TINY_T5_WIDTH,
        "pooled_projection_dim": TINY_CLIP_WIDTH,
        "axes_dims_rope": (4, 6, 6),  # (index, row, column); even, summing to the head dim
    }


def tiny_ae_config() -> dict:
    """AutoencoderKL kwargs: four levels (8x down) and 16 latent channels, at small width."""
    return {
        **ae_config(),
        # Two channel changes, as (128, 256, 512, 512) has, so both the encoder and the decoder
        # carry nin_shortcut convolutions.
        "block_out_channels": (8, 16, 32, 32),
        "layers_per_block": 1,
        "norm_num_groups": 8,
        "sample_size": TINY_SIZE,
    }


def tiny_clip_config() -> dict:
    """CLIPTextConfig kwargs for the tiny CLIP tokenizer of library/models/tiny.py."""
    return {
        **tiny_text_config("sd1"),  # quick-GELU, 77 positions, the tiny tokenizer's ids
        "hidden_size": TINY_CLIP_WIDTH,
        "intermediate_size": 2 * TINY_CLIP_WIDTH,
        "num_attention_heads": 2,
        "projection_dim": TINY_CLIP_WIDTH,
    }


def tiny_t5_config() -> dict:
    """T5Config kwargs: two gated-GELU layers for the tiny T5 tokenizer
    (library/models/families/flux/tiny.py)."""
    return {
        **t5_xxl_config(),
        "vocab_size": TINY_T5_VOCAB_SIZE,
        "d_model": TINY_T5_WIDTH,
        "d_kv": 12,  # heads * d_kv = d_model, as in XXL
        "d_ff": 2 * TINY_T5_WIDTH,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
    }
