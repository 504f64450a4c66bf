"""Tiny SD3 / SD3.5 components, built from the tiny configs under a seed.

The components have the layout of each variant (joint blocks with the pre-only last context
stream; the qk norms of SD3.5; 3.5 Medium's dual-attention block; the 16-channel VAE without
quant convs; CLIP-L and CLIP-G with their projections and T5 v1.1) at a fraction of the size, for
offline tests. The tokenizers are the tiny CLIP one of tests/kits/sd/tiny.py (for both CLIPs, as
SD3's share CLIP's vocabulary) and the tiny T5 one of tests/kits/flux/tiny.py.
"""

from __future__ import annotations

from library.models.families.sd3.shapes import Variant
from tests.kits.flux.tiny import build_seeded
from tests.kits.sd3.tiny_shapes import (
    tiny_clip_g_config,
    tiny_clip_l_config,
    tiny_t5_config,
    tiny_transformer_config,
    tiny_vae_config,
)


def build_tiny_sd3_components(variant: Variant = "sd3.5-medium", seed: int = 0) -> dict:
    """transformer, vae, text_encoder (CLIP-L), text_encoder_2 (CLIP-G) and text_encoder_3 (T5)
    with weights drawn under ``seed``; each from its own seed offset, so one component does not
    depend on the others. Constant-initialised parameters (norm scales, zero biases) get noise,
    so a converter that swaps two of them fails the tests."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    builders = {
        "transformer": lambda: SD3Transformer2DModel(**tiny_transformer_config(variant)),
        "vae": lambda: AutoencoderKL(**tiny_vae_config()),
        "text_encoder": lambda: CLIPTextModelWithProjection(CLIPTextConfig(**tiny_clip_l_config())),
        "text_encoder_2": lambda: CLIPTextModelWithProjection(
            CLIPTextConfig(**tiny_clip_g_config())
        ),
        "text_encoder_3": lambda: T5EncoderModel(T5Config(**tiny_t5_config())),
    }
    return build_seeded(builders, seed)
