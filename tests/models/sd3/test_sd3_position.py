"""kohya's SD3 position-table options: the scaled tables against the formula as kohya states it,
the table a batch takes by its area, per-sample random crops, and no change when both are off."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from library.models.families.sd3.position import (
    CroppedPositions,
    area_bounds,
    crops,
    install,
    patched_sides,
    scaled_table,
)
from tests.kits.sd3.tiny import build_tiny_sd3_components


def _kohya_scaled(width: int, grid: int, sample: int, base: int = 16) -> np.ndarray:
    """The scaled table as kohya's docstring states it: coordinates i / G scaled by
    base * G / sample and shifted by scale * (G - sample) / (2 G), w first, then 2-D sin-cos
    with w_k = 1 / 10000^(k / (D/4))."""
    scale = base * grid / sample
    shift = scale * (grid - sample) / (2 * grid)
    coords = np.arange(grid, dtype=np.float32) / grid * scale - shift
    w, h = np.meshgrid(coords, coords)  # w varies along the columns

    def one(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1).astype(np.float64), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return np.concatenate([one(width // 2, w), one(width // 2, h)], axis=1)


@pytest.mark.parametrize(("width", "side"), [(32, 4), (64, 10), (1536, 64)])
def test_scaled_table_is_kohyas_formula(width, side):
    ours = scaled_table(width, side)[0].numpy()
    expected = _kohya_scaled(width, int(side * 1.5), side)
    np.testing.assert_allclose(ours, expected, atol=2e-5)


def test_sides_and_area_bounds_follow_kohyas_rule():
    # 1024 and 768 px, a 512 x 768 bucket resolution (sqrt 627 -> 78 latent -> 39 patches)
    sides = patched_sides([(1024, 1024), (768, 768), (512, 768), (1024, 1024)])
    assert sides == [39, 48, 64]
    bounds = area_bounds(sides)
    assert bounds == [((39**2 + 48**2) // 2, 39), ((48**2 + 64**2) // 2, 48), (96 * 96, 64)]


def _tiny(crop_rate=0.0, resolutions=None, seed=0):
    transformer = build_tiny_sd3_components("sd3.5-medium", seed)["transformer"]
    if crop_rate or resolutions:
        install(transformer, crop_rate, resolutions)
    return transformer


def _call(transformer, latents):
    """The transformer on ``latents`` with fixed text (the same rows for any batch size)."""
    b = latents.shape[0]
    text = torch.randn(2, 5, transformer.config.joint_attention_dim,
                       generator=torch.Generator().manual_seed(1))[:b]  # fmt: skip
    pooled = torch.randn(2, transformer.config.pooled_projection_dim,
                         generator=torch.Generator().manual_seed(2))[:b]  # fmt: skip
    with torch.no_grad():
        return transformer(hidden_states=latents, encoder_hidden_states=text,
                           pooled_projections=pooled, timestep=torch.full((b,), 500.0)).sample  # fmt: skip


def test_installed_without_draws_is_the_centre_crop_and_keeps_the_state():
    plain = _tiny()
    installed = _tiny(crop_rate=0.5)
    assert isinstance(installed.pos_embed, CroppedPositions)
    assert installed.state_dict().keys() == plain.state_dict().keys()
    latents = torch.randn(2, 16, 8, 12, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(_call(installed, latents), _call(plain, latents), rtol=0, atol=0)


def test_each_sample_crops_where_its_draws_say():
    """Draws (crop?, row, column) per sample: a sample below the rate sees the table slice at its
    offsets, one above it the centre. The reference is diffusers' own centre crop of a table
    whose centre holds the wanted slice."""
    model = _tiny(crop_rate=0.5)
    latents = torch.randn(2, 16, 8, 12, generator=torch.Generator().manual_seed(3))
    draws = torch.tensor([[0.2, 0.0, 0.999], [0.7, 0.3, 0.3]])
    with crops(model, draws):
        ours = _call(model, latents)
    side, rows, cols = model.pos_embed.pos_embed_max_size, 4, 6
    table = model.pos_embed.pos_embed.reshape(side, side, -1)
    top, left = 0, side - cols  # draw 0.999 of (side - cols + 1) offsets is the last one
    shifted = table.clone()
    centre = ((side - rows) // 2, (side - cols) // 2)
    shifted[centre[0] : centre[0] + rows, centre[1] : centre[1] + cols] = table[
        top : top + rows, left : left + cols
    ]
    reference = _tiny()
    reference.pos_embed.pos_embed.copy_(shifted.reshape(1, side * side, -1))
    torch.testing.assert_close(ours[:1], _call(reference, latents)[:1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours[1:], _call(_tiny(), latents)[1:], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours[:1], _call(_tiny(), latents)[:1])  # the crop mattered
    assert model.pos_embed.difftune_draws is None  # the draws last one call


def test_scaled_tables_replace_the_stored_one_by_area():
    """With scaled tables the centre of the batch's own table is used, not the stored table."""
    model = _tiny(resolutions=[(64, 64), (128, 128)])  # 4 and 8 patches: tables of 6 and 12
    assert sorted(model.pos_embed.difftune_tables) == [4, 8]
    latents = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(4))  # 4 x 4
    reference = _tiny()
    side = reference.pos_embed.pos_embed_max_size
    table = scaled_table(reference.pos_embed.pos_embed.shape[-1], 4).reshape(6, 6, -1)
    stored = reference.pos_embed.pos_embed.reshape(side, side, -1).clone()
    centre = (side - 4) // 2
    stored[centre : centre + 4, centre : centre + 4] = table[1:5, 1:5]
    reference.pos_embed.pos_embed.copy_(stored.reshape(1, side * side, -1))
    torch.testing.assert_close(
        _call(model, latents), _call(reference, latents), rtol=1e-5, atol=1e-6
    )
    assert not torch.allclose(_call(model, latents), _call(_tiny(), latents))


def test_an_image_longer_than_every_table_gets_a_table_of_its_own():
    """Sampling at 128 px after training at 32 px: kohya adds a table for the larger size."""
    model = _tiny(resolutions=[(32, 32)])  # 2 patches: a 3 x 3 table
    latents = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(5))  # 4 x 4
    ours = _call(model, latents)
    assert sorted(model.pos_embed.difftune_tables) == [2, 4]
    again = _tiny(resolutions=[(32, 32), (64, 64)])  # the 4-patch table from the start
    torch.testing.assert_close(ours, _call(again, latents), rtol=0, atol=0)
    assert math.isclose(area_bounds([2])[0][0], 9)
