"""Z-Image component configs as data: the released models (tiny ones of the same layout, for the
tests, are in tests/kits/zimage/tiny_shapes.py).

Every function returns a fresh dict of constructor kwargs:
``ZImageTransformer2DModel(**transformer_config())``, ``Qwen3Model(Qwen3Config(**...))``,
``AutoencoderKL(**ae_config())``, ``FlowMatchEulerDiscreteScheduler(**scheduler_config(v))``.

Z-Image (Base) and Z-Image-Turbo share every architecture number; they differ in weights and in
the scheduler's shift. Sources of the full-size numbers:
- [hub] the transformer/, text_encoder/, vae/ and scheduler/ config files of the
  Tongyi-MAI/Z-Image-Turbo and Tongyi-MAI/Z-Image repositories, as public ports quote them
  verbatim (e.g. utensils/mold's config tests and Z-Image.swift's model-layout notes, which list
  the Base repository's transformer and text-encoder numbers as equal to Turbo's and its shift
  as 6.0);
- [diffusers] ``ZImageTransformer2DModel``'s defaults in diffusers 0.42.1, which equal [hub] but
  for ``axes_lens`` (1024 there, 1536 in the released config);
- [flux] the 16-channel AE config of library/models/released_configs.py: Z-Image ships FLUX.1's AE (same
  channels, 16 latent channels, scaling_factor 0.3611, shift_factor 0.1159).
The tests build the full-size models on the meta device and check their parameter counts.
"""

from __future__ import annotations

from typing import Literal

from library.models.released_configs import ae16_config, qwen3_4b_config

Variant = Literal["turbo", "base"]
VARIANTS: tuple[Variant, ...] = ("turbo", "base")

LATENT_CHANNELS = 16
PATCH_SIZE = 2  # 2x2 latent patches per token ([hub] all_patch_size [2])
F_PATCH_SIZE = 1  # one frame per token ([hub] all_f_patch_size [1]): images are 1-frame videos
TEXT_WIDTH = 2560  # Qwen3-4B's hidden size = the transformer's cap_feat_dim
# [hub] scheduler_config.json: static shift (use_dynamic_shifting false) of 3.0 for the distilled
# Turbo and 6.0 for Base.
SCHEDULER_SHIFT: dict[str, float] = {"turbo": 3.0, "base": 6.0}


def _check(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown Z-Image variant {variant!r}; expected one of {VARIANTS}")


# --- full size --------------------------------------------------------------------------------


def transformer_config() -> dict:
    """ZImageTransformer2DModel kwargs of Z-Image and Z-Image-Turbo (about 6.15B parameters)."""
    return {
        "all_patch_size": (PATCH_SIZE,),
        "all_f_patch_size": (F_PATCH_SIZE,),
        "in_channels": LATENT_CHANNELS,
        "dim": 3840,
        "n_layers": 30,  # the joint (image + caption) blocks
        "n_refiner_layers": 2,  # per stream: noise_refiner (image) and context_refiner (caption)
        "n_heads": 30,  # head dim 128
        "n_kv_heads": 30,  # no grouped-query attention
        "norm_eps": 1e-5,
        "qk_norm": True,
        "cap_feat_dim": TEXT_WIDTH,
        "rope_theta": 256.0,
        "t_scale": 1000.0,  # the model multiplies its timestep input (in [0, 1]) by this
        "axes_dims": [32, 48, 48],  # RoPE split of the head dim: (frame/caption index, row, column)
        "axes_lens": [1536, 512, 512],  # [hub]; diffusers' default is [1024, 512, 512]
    }


def text_encoder_config() -> dict:
    """Qwen3Config kwargs of Qwen3-4B, Z-Image's text encoder (loaded as ``Qwen3Model``: the
    pipeline loads the base model without the LM head)."""
    return qwen3_4b_config()


def ae_config() -> dict:
    """AutoencoderKL kwargs of Z-Image's VAE: FLUX.1's AE ([flux]; the same [hub] numbers)."""
    return ae16_config()


def scheduler_config(variant: Variant = "turbo") -> dict:
    """FlowMatchEulerDiscreteScheduler kwargs of ``variant``: a static shift, no dynamic one.

    The pipeline computes a resolution-dependent ``mu`` (calculate_shift) and passes it, but the
    scheduler only uses ``mu`` when use_dynamic_shifting is true, which neither release sets.
    """
    _check(variant)
    return {
        "num_train_timesteps": 1000,
        "use_dynamic_shifting": False,
        "shift": SCHEDULER_SHIFT[variant],
    }
