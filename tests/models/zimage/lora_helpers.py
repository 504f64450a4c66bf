"""Shared test data of the Z-Image LoRA tests: a tiny transformer and random LoRA factors."""

from __future__ import annotations

import pytest
import torch

from library.models.families.zimage.lora_keys import NAMES
from library.networks import linear_files
from tests.kits.zimage.tiny_shapes import tiny_transformer_config


def read_lora(tensors, transformer, **keys):
    """The shared LoRA reader with Z-Image's names."""
    return linear_files.read_lora(tensors, transformer, NAMES, **keys)


def write_lora(weights):
    """The shared LoRA writer with Z-Image's names."""
    return linear_files.write_lora(weights, NAMES)


def read_lycoris(tensors, transformer, source="LyCORIS file"):
    """The shared LyCORIS reader with Z-Image's names."""
    return linear_files.read_lycoris(tensors, transformer, NAMES, source)


def write_lycoris(modules):
    """The shared LyCORIS writer with Z-Image's names."""
    return linear_files.write_lycoris(modules, NAMES)


def tiny_transformer(seed: int = 0):
    """A tiny diffusers ZImageTransformer2DModel with weights drawn under ``seed``."""
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(seed)
    return ZImageTransformer2DModel(**tiny_transformer_config())


def random_factors(
    transformer, paths, seed: int = 1, dtype=torch.float32, rank=None, alpha=None
) -> dict:
    """{path: (down, up, alpha)} for ``paths``; unless ``rank``/``alpha`` are given, ranks run
    1..3 and alphas differ per path, so a mixed-up rank, alpha or row block shows."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for index, path in enumerate(sorted(paths)):
        layer = transformer.get_submodule(path)
        layer = getattr(layer, "base_layer", layer)
        r = rank or 1 + index % 3
        down = torch.randn(r, layer.in_features, generator=generator) * 0.1
        up = torch.randn(layer.out_features, r, generator=generator) * 0.1
        weights[path] = (down.to(dtype), up.to(dtype), alpha or 0.5 + 0.25 * index)
    return weights


def delta(factors) -> torch.Tensor:
    """alpha / rank * up @ down in float32: the weight change a LoRA module makes."""
    down, up, alpha = factors
    return float(alpha) / down.shape[0] * (up.float() @ down.float())


def assert_same_factors(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for path, (down, up, alpha) in expected.items():
        got_down, got_up, got_alpha = got[path]
        assert got_down.dtype == down.dtype and torch.equal(got_down, down), path
        assert got_up.dtype == up.dtype and torch.equal(got_up, up), path
        assert got_alpha == pytest.approx(float(alpha), rel=1e-6), path
