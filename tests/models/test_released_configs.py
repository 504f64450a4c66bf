"""The shared released configs (library/models/released_configs.py) against the sources they
cite: Qwen-Image's VAE as Qwen-Image's own table of its sizes and latent statistics states it."""

from __future__ import annotations

from library.models.families.qwenimage.shapes import vae_config
from library.models.released_configs import video_vae16_config


def test_the_video_vae_is_the_released_one():
    config = video_vae16_config()
    for key, value in vae_config().items():
        assert list(config[key]) == value if isinstance(value, list) else config[key] == value
