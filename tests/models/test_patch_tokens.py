"""Latents as patch tokens (library.models.patch_tokens), against diffusers' Krea2Pipeline's own
packing and position ids."""

from __future__ import annotations

import pytest
import torch

from library.models.patch_tokens import grid_positions, pack, unpack


def test_pack_and_unpack_are_the_pipelines():
    from diffusers import Krea2Pipeline

    pipe = Krea2Pipeline.__new__(Krea2Pipeline)
    pipe.patch_size, pipe.vae_scale_factor = 2, 8
    latents = torch.randn(2, 16, 1, 6, 4)
    tokens = pack(latents)
    theirs = pipe._pack_latents(latents[:, :, 0], 2, 16, 6, 4)
    assert torch.equal(tokens, theirs)
    assert torch.equal(unpack(tokens, 6, 4), pipe._unpack_latents(theirs, 48, 32))
    assert torch.equal(unpack(tokens, 6, 4), latents)


def test_positions_are_the_pipelines():
    from diffusers import Krea2Pipeline

    theirs = Krea2Pipeline.prepare_position_ids(5, 3, 4, torch.device("cpu"))
    assert torch.equal(grid_positions(5, 3, 4), theirs)


def test_odd_latent_sides_are_refused():
    with pytest.raises(ValueError, match="multiples of 16 pixels"):
        pack(torch.zeros(1, 16, 1, 5, 4))
