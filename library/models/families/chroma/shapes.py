"""Chroma's transformer config as data: the released model (a tiny one of the same layout, for
the tests, is in tests/kits/chroma/tiny_shapes.py).

Sources: diffusers 0.42.1 ``ChromaTransformer2DModel`` defaults, which are lodestones/Chroma1-HD's
transformer/config.json (FLUX.1's 19 double and 38 single blocks at width 3072, T5-XXL's 4096
wide states, and the "distilled guidance layer": an approximator of 5 residual MLPs of width
5120 that turns the timestep into every block's modulation). The AE is FLUX.1's 16-channel one
and T5 is google/t5-v1_1-xxl's encoder (library/models/released_configs.py has both configs).
"""

from __future__ import annotations

from library.models.patch_tokens import PATCH as PATCH_SIZE  # latents are packed 2x2 into tokens
from library.models.released_configs import AE16_LATENT_CHANNELS as LATENT_CHANNELS

# ChromaPipeline's default max_sequence_length (it refuses more): T5 tokens per caption.
T5_MAX_LENGTH = 512


def transformer_config() -> dict:
    """ChromaTransformer2DModel kwargs of the released model."""
    return {
        "patch_size": 1,  # the 2x2 packing happens before the model
        "in_channels": LATENT_CHANNELS * PATCH_SIZE * PATCH_SIZE,
        "out_channels": None,
        "num_layers": 19,
        "num_single_layers": 38,
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,  # T5-XXL's width
        "axes_dims_rope": (16, 56, 56),
        "approximator_num_channels": 64,
        "approximator_hidden_dim": 5120,
        "approximator_layers": 5,
    }


# The sampling scheduler of a folder without scheduler/ (FLUX.1 dev's released
# FlowMatchEulerDiscreteScheduler config, which Chroma's diffusers folders carry: Euler over
# linspace(1, 1/N, N), shifted by the image's token count).
SCHEDULER_CONFIG = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}
