"""Run-level cache helpers: the bucket grid a UNet needs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.errors import ConfigError
from library.models.families.sd.family import SD1, SDXL
from library.training.caching import check_bucket_steps

# block_out_channels of the real UNets: SD 1.x/2.x downsample 3 times, SDXL twice.
SD15_BLOCKS, SDXL_BLOCKS = (320, 640, 1280, 1280), (320, 640, 1280)


def _components(blocks, name):
    unet = SimpleNamespace(config=SimpleNamespace(block_out_channels=blocks))
    return SimpleNamespace(denoiser=unet, family=SD1 if name == "SD1" else SDXL)


def _config(steps: int, enable_bucket: bool = True):
    dataset = DatasetConfig(
        resolution=1024, enable_bucket=enable_bucket, bucket_reso_steps=steps,
        subsets=[SubsetConfig(image_dir="x")],
    )  # fmt: skip
    return SimpleNamespace(datasets=[dataset])


def test_bucket_grid_is_the_vae_factor_times_the_unet_downsampling():
    sd1, sdxl = _components(SD15_BLOCKS, "SD1"), _components(SDXL_BLOCKS, "SDXL")
    assert sd1.family.bucket_grid(sd1.denoiser) == 8 * 2**3
    assert sdxl.family.bucket_grid(sdxl.denoiser) == 8 * 2**2


def test_bucket_steps_must_fit_the_unet():
    check_bucket_steps(_config(32), _components(SDXL_BLOCKS, "SDXL"))
    check_bucket_steps(_config(64), _components(SD15_BLOCKS, "SD1"))
    check_bucket_steps(_config(32, enable_bucket=False), _components(SD15_BLOCKS, "SD1"))
    with pytest.raises(
        ConfigError, match=r"datasets\[0\]\.bucket_reso_steps = 32 .* multiples of 64"
    ):
        check_bucket_steps(_config(32), _components(SD15_BLOCKS, "SD1"))
