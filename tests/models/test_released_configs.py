"""The shared released configs (library/models/released_configs.py) against the sources they
cite: the video VAE as Qwen/Qwen-Image's vae/config.json states its sizes and latent statistics."""

from __future__ import annotations

from library.models.released_configs import video_vae16_config

# Qwen/Qwen-Image's vae/config.json (AutoencoderKLQwenImage), written down from the hub
RELEASED_VAE = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                     0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
    "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160],
}  # fmt: skip


def test_the_video_vae_is_the_released_one():
    config = video_vae16_config()
    for key, value in RELEASED_VAE.items():
        assert list(config[key]) == value if isinstance(value, list) else config[key] == value
