"""FLUX.1 component configs as data: the full-size models (tiny ones of the same layout, for the
tests, are in tests/kits/flux/tiny_shapes.py).

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
