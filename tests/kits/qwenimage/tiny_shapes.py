"""Tiny Qwen-Image component configs: the released layout
(library/models/families/qwenimage/shapes.py, Qwen2.5-VL's and the video VAE's shared configs) at
a small width, for the tests' tiny models."""

from __future__ import annotations

from library.models.families.qwen_vl_file import QWEN25VL_7B
from library.models.families.qwenimage.shapes import transformer_config
from library.models.released_configs import video_vae16_config

TINY_HEAD_DIM, TINY_HEADS = 16, 2  # transformer width 32; head dim 16 = sum(TINY_AXES_DIMS)
TINY_AXES_DIMS = (4, 6, 6)  # even parts (RoPE rotates pairs)
TINY_TEXT_WIDTH = 40  # distinct from the transformer's 32, so a caption fed as an image fails
TINY_TEXT_VOCAB = 272  # more rows than the tiny tokenizer's 269 tokens, as Qwen2.5-VL has
TINY_ENDOFTEXT, TINY_IM_END = 262, 264  # <|endoftext|>, <|im_end|> in the tiny tokenizer
# <|vision_start|>, <|vision_end|>, <|image_pad|>, <|video_pad|> in the tiny tokenizer
TINY_VISION_START, TINY_VISION_END, TINY_IMAGE_PAD, TINY_VIDEO_PAD = 265, 266, 267, 268
TINY_SIZE = 64  # pixels: latents 8 x 8, 16 image tokens


def tiny_transformer_config() -> dict:
    """QwenImageTransformer2DModel kwargs: 2 dual-stream blocks at width 32."""
    return {
        **transformer_config(),
        "num_layers": 2,
        "attention_head_dim": TINY_HEAD_DIM,
        "num_attention_heads": TINY_HEADS,
        "joint_attention_dim": TINY_TEXT_WIDTH,
        "axes_dims_rope": TINY_AXES_DIMS,
    }


def tiny_text_encoder_config() -> dict:
    """Qwen2_5_VLConfig kwargs: a three-layer language model with grouped-query attention and
    the multimodal RoPE split (mrope_section sums to half the head dim), and a one-block vision
    tower (run by the edit model, which shows the encoder its reference image), with the tiny
    tokenizer's ids of the vision tokens."""
    config = QWEN25VL_7B
    return {
        "vision_start_token_id": TINY_VISION_START,
        "vision_end_token_id": TINY_VISION_END,
        "image_token_id": TINY_IMAGE_PAD,
        "video_token_id": TINY_VIDEO_PAD,
        "text_config": {
            **config["text_config"],
            "vocab_size": TINY_TEXT_VOCAB,
            "hidden_size": TINY_TEXT_WIDTH,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,  # the pipeline's 1024 + 34 caption tokens fit
            "bos_token_id": TINY_ENDOFTEXT,  # the tiny tokenizer's ids of Qwen's tokens
            "eos_token_id": TINY_IM_END,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [1, 2, 2],  # head dim 10
            },
        },
        "vision_config": {
            **config["vision_config"],
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": TINY_TEXT_WIDTH,
            "fullatt_block_indexes": [0],
        },
    }


def tiny_vae_config() -> dict:
    """AutoencoderKLQwenImage kwargs: the released layout (levels, residual blocks per level,
    16 latent channels with the released per-channel statistics; 8x smaller sides, so the
    pipeline's 16-pixel grid holds) at base width 8."""
    return {**video_vae16_config(), "base_dim": 8}
