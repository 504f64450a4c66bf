"""Fixtures for adapter tests: fresh copies of the tiny SD 1.x UNet and text encoder."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_sd1_parts():
    from tests.kits.sd.tiny import build_tiny_components

    return build_tiny_components("sd1", seed=0)


@pytest.fixture
def unet(tiny_sd1_parts):
    return copy.deepcopy(tiny_sd1_parts["unet"]).eval()


@pytest.fixture
def text_encoder(tiny_sd1_parts):
    return copy.deepcopy(tiny_sd1_parts["text_encoder"]).eval()


@pytest.fixture(scope="session")
def unet_inputs():
    """(latents, timesteps, text embeddings) for the tiny UNet."""
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(2, 4, 8, 8, generator=gen)
    context = torch.randn(2, 77, 32, generator=gen)
    return latents, torch.tensor([10, 500]), context


@pytest.fixture(scope="session")
def token_ids():
    gen = torch.Generator().manual_seed(2)
    return torch.randint(0, 500, (2, 77), generator=gen)


def run_unet(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(*inputs).sample


def run_text(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0]


@pytest.fixture
def unet_out():
    return run_unet


@pytest.fixture
def text_out():
    return run_text
