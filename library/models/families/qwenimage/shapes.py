"""Qwen-Image component configs as data: the released model (tiny ones of the same layout, for
the tests, are in tests/kits/qwenimage/tiny_shapes.py).

Every function returns a fresh dict of constructor kwargs:
``QwenImageTransformer2DModel(**transformer_config())``,
``Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**text_encoder_config()))``,
``AutoencoderKLQwenImage(**vae_config())``, ``FlowMatchEulerDiscreteScheduler(**scheduler_config())``.

Sources of the full-size numbers:

- [diffusers] the defaults of QwenImageTransformer2DModel and AutoencoderKLQwenImage in diffusers
  0.42.1, which are the Qwen/Qwen-Image repository's transformer/ and vae/ configs (60 dual-stream
  blocks of width 24 x 128, joint_attention_dim 3584; a 16-channel video VAE, 8x smaller sides,
  per-channel latents_mean / latents_std);
- [hub] text_encoder/config.json (Qwen2.5-VL-7B-Instruct, Qwen2_5_VLForConditionalGeneration)
  and scheduler/config.json of Qwen/Qwen-Image: FlowMatchEulerDiscreteScheduler with a dynamic,
  exponential time shift (``use_dynamic_shifting`` true, mu from the image's token count between
  base_shift 0.5 at 256 tokens and max_shift 0.9 at 8192, ``shift_terminal`` 0.02).
"""

from __future__ import annotations

LATENT_CHANNELS = 16
PATCH_SIZE = 2  # 2x2 latent patches per token: 64 values per token
TEXT_WIDTH = 3584  # Qwen2.5-VL-7B's hidden size = the transformer's joint_attention_dim
VAE_FACTOR = 8  # 2 ** len(temperal_downsample): pixels per latent side
PIXEL_MULTIPLE = VAE_FACTOR * PATCH_SIZE  # image sides: multiples of 16


# --- full size --------------------------------------------------------------------------------


def transformer_config() -> dict:
    """QwenImageTransformer2DModel kwargs of Qwen-Image (about 20.4B parameters)."""
    return {
        "patch_size": PATCH_SIZE,
        "in_channels": LATENT_CHANNELS * PATCH_SIZE * PATCH_SIZE,
        "out_channels": LATENT_CHANNELS,
        "num_layers": 60,
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "joint_attention_dim": TEXT_WIDTH,
        "guidance_embeds": False,
        "axes_dims_rope": (16, 56, 56),
    }


def text_encoder_config() -> dict:
    """Qwen2_5_VLConfig kwargs of Qwen2.5-VL-7B-Instruct, Qwen-Image's text encoder ([hub]); the
    pipeline runs its language model on text alone (the vision tower is loaded, never run)."""
    return {
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "hidden_act": "silu",
            "max_position_embeddings": 128000,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [16, 24, 24],
            },
        },
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": TEXT_WIDTH,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
        },
    }


def vae_config() -> dict:
    """AutoencoderKLQwenImage kwargs of Qwen-Image's VAE ([diffusers] defaults)."""
    return {
        "base_dim": 96,
        "z_dim": LATENT_CHANNELS,
        "dim_mult": [1, 2, 4, 4],
        "num_res_blocks": 2,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                         0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
        "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                        3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160],
    }  # fmt: skip


def scheduler_config() -> dict:
    """FlowMatchEulerDiscreteScheduler kwargs of Qwen-Image ([hub]): the pipeline computes mu
    from the image's token count (calculate_shift over base/max_image_seq_len and base/max_shift)
    and the scheduler shifts sigma exponentially by it, then stretches the schedule so that its
    last sigma is shift_terminal."""
    return {
        "num_train_timesteps": 1000,
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "max_image_seq_len": 8192,
        "max_shift": 0.9,
        "shift": 1.0,
        "shift_terminal": 0.02,
        "time_shift_type": "exponential",
        "use_dynamic_shifting": True,
    }
