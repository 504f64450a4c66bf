"""Qwen-Image component configs as data: the released model (tiny ones of the same layout, for
the tests, are in tests/kits/qwenimage/tiny_shapes.py). The text encoder is Qwen2.5-VL-7B-Instruct
and the VAE the released 16-channel video VAE, whose configs are shared
(``qwen_vl_file.QWEN25VL_7B``, ``released_configs.video_vae16_config``).

Every function returns a fresh dict of constructor kwargs:
``QwenImageTransformer2DModel(**transformer_config())``,
``FlowMatchEulerDiscreteScheduler(**scheduler_config())``.

Sources of the full-size numbers:

- [diffusers] the defaults of QwenImageTransformer2DModel in diffusers 0.42.1, which are the
  Qwen/Qwen-Image repository's transformer/ config (60 dual-stream blocks of width 24 x 128,
  joint_attention_dim 3584);
- [hub] scheduler/config.json of Qwen/Qwen-Image: FlowMatchEulerDiscreteScheduler with a
  dynamic, exponential time shift (``use_dynamic_shifting`` true, mu from the image's token
  count between base_shift 0.5 at 256 tokens and max_shift 0.9 at 8192, ``shift_terminal``
  0.02).
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
