"""Latents as patch tokens (library.models.patch_tokens), against diffusers' Krea2Pipeline's own
packing and position ids, and the four-axis ids against Flux2KleinPipeline's."""

from __future__ import annotations

import pytest
import torch

from library.models.patch_tokens import grid_positions, lattice_ids, pack, unpack


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


def test_lattice_ids_are_the_four_axis_pipelines():
    """An image's ids, a reference's at its time index and the text's, as Flux2KleinPipeline
    computes them."""
    from diffusers import Flux2KleinPipeline as Pipe

    latents, text = torch.zeros(2, 8, 3, 5), torch.zeros(2, 7, 4)
    assert torch.equal(lattice_ids(0, 3, 5, 1, 2, "cpu"), Pipe._prepare_latent_ids(latents))
    assert torch.equal(lattice_ids(0, 1, 1, 7, 2, "cpu"), Pipe._prepare_text_ids(text))
    references = [torch.zeros(1, 8, 4, 2), torch.zeros(1, 8, 2, 3)]
    ours = torch.cat([lattice_ids(10 * (k + 1), *r.shape[-2:], 1, 1, "cpu")
                      for k, r in enumerate(references)], dim=1)  # fmt: skip
    assert torch.equal(ours, Pipe._prepare_image_ids(references))
