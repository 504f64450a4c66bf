from __future__ import annotations

import colorsys
import io

import numpy as np
import pytest
import torch
from PIL import Image

from library.data.augment import AugmentDraws
from library.data.images import (
    check_image,
    cover_geometry,
    crop_geometry,
    load_image,
    load_image_with_sizes,
    load_training_image,
)
from library.errors import DataError

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def _expected(rgb, height, width):
    """The tensor of a solid `rgb` image, computed by hand: v / 255 * 2 - 1."""
    values = torch.tensor([c / 255 * 2 - 1 for c in rgb], dtype=torch.float32)
    return values.view(3, 1, 1).expand(3, height, width)


def _striped(size, stripes, vertical=True):
    """An image of solid stripes [(extent, color)] along x (vertical=True) or y."""
    image = Image.new("RGB", size)
    offset = 0
    for extent, color in stripes:
        box = (
            (offset, 0, offset + extent, size[1])
            if vertical
            else (0, offset, size[0], offset + extent)
        )
        image.paste(color, box)
        offset += extent
    return image


def test_wide_image_is_center_cropped_without_resampling(tmp_path):
    # 40x20 into 20x20: scale 1, the 10-pixel red and blue side borders are cropped away.
    _striped((40, 20), [(10, RED), (20, GREEN), (10, BLUE)]).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png", (20, 20))
    assert out.dtype == torch.float32 and out.shape == (3, 20, 20)
    torch.testing.assert_close(out, _expected(GREEN, 20, 20), rtol=0, atol=1e-6)


def test_tall_image_is_center_cropped(tmp_path):
    _striped((16, 48), [(8, RED), (32, GREEN), (8, BLUE)], vertical=False).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png", (16, 32))
    torch.testing.assert_close(out, _expected(GREEN, 32, 16), rtol=0, atol=1e-6)


def test_downscale_keeps_aspect_and_crops_center(tmp_path):
    # 160x80 -> cover 40x40 = resize to 80x40, crop x in [20, 60) = source x in [40, 120): green.
    _striped((160, 80), [(40, RED), (80, GREEN), (40, BLUE)]).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png", (40, 40))
    assert out.shape == (3, 40, 40)
    # Away from the crop edges (the filter reaches ~3 output pixels) the image is pure green.
    torch.testing.assert_close(out[:, :, 4:-4], _expected(GREEN, 40, 32), rtol=0, atol=2 / 255)
    # At the edges the red/blue borders bleed in a little, symmetrically.
    assert out[0, :, 0].mean() > out[0, :, 20].mean()
    assert out[2, :, -1].mean() > out[2, :, 20].mean()


def test_upscale_covers_target(tmp_path):
    Image.new("RGB", (10, 20), (51, 102, 204)).save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png", (64, 64))
    torch.testing.assert_close(out, _expected((51, 102, 204), 64, 64), rtol=0, atol=2 / 255)


def test_value_range_is_minus_one_to_one(tmp_path):
    image = Image.new("RGB", (8, 8), (0, 0, 0))
    image.paste((255, 255, 255), (4, 0, 8, 8))
    image.save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png", (8, 8))
    assert out[:, :, :4].eq(-1).all() and out[:, :, 4:].eq(1).all()


def test_transparency_is_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # fully transparent black
    rgba.paste((255, 0, 0, 128), (0, 0, 4, 8))  # half-transparent red on the left
    rgba.save(tmp_path / "a.png")
    out = load_image(tmp_path / "a.png", (8, 8))
    torch.testing.assert_close(out[:, :, 4:], _expected((255, 255, 255), 8, 4), rtol=0, atol=1e-6)
    # red over white at alpha 128/255: G and B = 255 * (1 - 128/255) = 127
    torch.testing.assert_close(
        out[:, :, :4], _expected((255, 127, 127), 8, 4), rtol=0, atol=1.5 / 255
    )


def test_palette_and_gray_images_become_rgb(tmp_path):
    palette = Image.new("P", (8, 8), 0)
    palette.putpalette([10, 20, 30] + [0, 0, 0] * 255)
    palette.save(tmp_path / "p.png")
    Image.new("L", (8, 8), 200).save(tmp_path / "l.png")
    torch.testing.assert_close(
        load_image(tmp_path / "p.png", (8, 8)), _expected((10, 20, 30), 8, 8)
    )
    torch.testing.assert_close(load_image(tmp_path / "l.png", (8, 8)), _expected((200,) * 3, 8, 8))


def test_exif_orientation_is_applied(tmp_path):
    # Stored 20 wide x 40 tall, top half red; orientation 6 = display rotated 90 degrees clockwise,
    # so the viewer sees 40x20 with the red half on the right.
    stored = _striped((20, 40), [(20, RED), (20, BLUE)], vertical=False)
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "a.jpg", exif=exif, quality=100)
    assert check_image(tmp_path / "a.jpg") == (40, 20)
    out = load_image(tmp_path / "a.jpg", (40, 20))
    torch.testing.assert_close(out[:, :, :16], _expected(BLUE, 20, 16), rtol=0, atol=0.05)
    torch.testing.assert_close(out[:, :, 24:], _expected(RED, 20, 16), rtol=0, atol=0.05)


def test_check_image_returns_size(tmp_path):
    Image.new("RGB", (24, 16)).save(tmp_path / "a.webp")
    assert check_image(tmp_path / "a.webp") == (24, 16)


def test_corrupt_and_truncated_images_are_errors(tmp_path):
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    buffer = io.BytesIO()
    noise = Image.effect_noise((64, 64), 50).convert("RGB")
    noise.save(buffer, format="PNG")
    (tmp_path / "cut.png").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    for name in ["junk.png", "cut.png"]:
        with pytest.raises(DataError, match=name):
            check_image(tmp_path / name)
        with pytest.raises(DataError, match=name):
            load_image(tmp_path / name, (64, 64))
    with pytest.raises(DataError, match="missing.png"):
        check_image(tmp_path / "missing.png")


# --- training loads: crop placement, flip, hue shift, alpha ---------------------------------


def _noise(size, seed=0, mode="RGB"):
    """A deterministic noise image, so any misplaced pixel shows."""
    generator = torch.Generator().manual_seed(seed)
    channels = len(mode)
    values = torch.randint(0, 256, (size[1], size[0], channels), generator=generator)
    return Image.fromarray(values.to(torch.uint8).numpy().squeeze(), mode)


def _as_tensor(image):
    """A PIL RGB image as the [-1, 1] tensor, computed independently of the loader."""
    return (
        torch.tensor(list(image.getdata()), dtype=torch.float32)
        .view(image.height, image.width, 3)
        .permute(2, 0, 1)
        / 127.5
        - 1
    )


def _draws(flip=False, crop=None, hue=0.0):
    return AugmentDraws(flip=flip, crop_fraction=crop, hue_shift=hue)


def test_crop_geometry_places_the_crop_in_the_slack():
    # 64x32 into 16x16: scale 0.5 -> 32x16, 16 pixels of horizontal slack, none vertical.
    assert crop_geometry((64, 32), (16, 16)) == cover_geometry((64, 32), (16, 16))
    assert crop_geometry((64, 32), (16, 16), (0.0, 0.0)) == ((32, 16), (0, 0))
    assert crop_geometry((64, 32), (16, 16), (1.0, 1.0)) == ((32, 16), (16, 0))
    assert crop_geometry((64, 32), (16, 16), (0.5, 0.9)) == ((32, 16), (8, 0))  # floor(0.5 * 17)
    # Slack 3: the four offsets each take a quarter of [0, 1).
    fractions = [0.0, 0.24, 0.25, 0.49, 0.5, 0.74, 0.75, 0.99, 1.0]
    lefts = [crop_geometry((23, 20), (20, 20), (f, 0.5))[1][0] for f in fractions]
    assert lefts == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    with pytest.raises(ValueError, match="outside"):
        crop_geometry((64, 32), (16, 16), (1.5, 0.0))


def test_crop_fraction_corners_match_pil_crops(tmp_path):
    wide = _noise((64, 32), seed=1)
    wide.save(tmp_path / "wide.png")
    resized = wide.resize((32, 16), Image.Resampling.LANCZOS)
    first = load_training_image(tmp_path / "wide.png", (16, 16), _draws(crop=(0.0, 0.0)))
    last = load_training_image(tmp_path / "wide.png", (16, 16), _draws(crop=(1.0, 1.0)))
    assert torch.equal(first.pixels, _as_tensor(resized.crop((0, 0, 16, 16))))
    assert torch.equal(last.pixels, _as_tensor(resized.crop((16, 0, 32, 16))))
    assert (first.crop_top_left, last.crop_top_left) == ((0, 0), (0, 16))

    tall = _noise((24, 48), seed=2)  # no resize, 24 pixels of vertical slack
    tall.save(tmp_path / "tall.png")
    top = load_training_image(tmp_path / "tall.png", (24, 24), _draws(crop=(0.0, 0.0)))
    bottom = load_training_image(tmp_path / "tall.png", (24, 24), _draws(crop=(1.0, 1.0)))
    assert torch.equal(top.pixels, _as_tensor(tall.crop((0, 0, 24, 24))))
    assert torch.equal(bottom.pixels, _as_tensor(tall.crop((0, 24, 24, 48))))
    assert bottom.crop_top_left == (24, 0) and bottom.original_size == (48, 24)


def test_flip_is_the_mirror_of_the_unflipped_load(tmp_path):
    _noise((50, 30), seed=3).save(tmp_path / "a.png")
    plain = load_training_image(tmp_path / "a.png", (24, 16), _draws(crop=(0.3, 0.0)))
    flipped = load_training_image(tmp_path / "a.png", (24, 16), _draws(True, (0.3, 0.0)))
    assert torch.equal(flipped.pixels, torch.flip(plain.pixels, dims=[2]))


def test_flipped_crop_top_left_is_measured_in_the_flipped_image(tmp_path):
    image = _noise((48, 32), seed=4)  # into 32x32: no resize, 16 pixels of horizontal slack
    image.save(tmp_path / "a.png")
    for fraction, left in [(0.0, 0), (1.0, 16), (0.5, 8)]:
        plain = load_training_image(tmp_path / "a.png", (32, 32), _draws(crop=(fraction, 0)))
        flipped = load_training_image(tmp_path / "a.png", (32, 32), _draws(True, (fraction, 0)))
        assert plain.crop_top_left == (0, left)
        mirrored_left = 48 - left - 32
        assert flipped.crop_top_left == (0, mirrored_left)
        # The model sees exactly the mirrored image's crop at that corner.
        mirrored = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        expected = mirrored.crop((mirrored_left, 0, mirrored_left + 32, 32))
        assert torch.equal(flipped.pixels, _as_tensor(expected))


def test_zero_hue_shift_is_exact_and_matches_load_image_with_sizes(tmp_path):
    _noise((40, 30), seed=5).save(tmp_path / "a.png")
    loaded = load_training_image(tmp_path / "a.png", (20, 20), _draws())
    bare = load_training_image(tmp_path / "a.png", (20, 20))
    pixels, original, crop = load_image_with_sizes(tmp_path / "a.png", (20, 20))
    assert torch.equal(loaded.pixels, bare.pixels) and torch.equal(loaded.pixels, pixels)
    assert (loaded.original_size, loaded.crop_top_left) == (original, crop) == ((30, 40), (0, 3))
    assert loaded.alpha is None
    # Independent: the resize and center crop done with PIL here.
    resized = Image.open(tmp_path / "a.png").resize((27, 20), Image.Resampling.LANCZOS)
    assert torch.equal(pixels, _as_tensor(resized.crop((3, 0, 23, 20))))


def test_hue_shift_keeps_greys_and_moves_a_saturated_hue(tmp_path):
    Image.new("RGB", (8, 8), (90, 90, 90)).save(tmp_path / "grey.png")
    Image.new("RGB", (8, 8), (200, 40, 90)).save(tmp_path / "red.png")
    shift = 7 / 360
    grey = load_training_image(tmp_path / "grey.png", (8, 8), _draws(hue=shift))
    assert torch.equal(grey.pixels, load_image(tmp_path / "grey.png", (8, 8)))
    red = load_training_image(tmp_path / "red.png", (8, 8), _draws(hue=-shift))
    h0, s0, v0 = colorsys.rgb_to_hsv(200 / 255, 40 / 255, 90 / 255)
    for pixel in red.pixels.flatten(1).T:
        h, s, v = colorsys.rgb_to_hsv(*((pixel + 1) / 2).tolist())
        assert h == pytest.approx((h0 - shift) % 1, abs=1e-5)
        assert (s, v) == pytest.approx((s0, v0), abs=1e-5)


def test_alpha_follows_crop_and_flip(tmp_path):
    # Alpha encodes the column: 5 * x at column x of a 48x32 image; into 32x32 (no resize).
    rgba = Image.new("RGBA", (48, 32), (10, 20, 30, 0))
    rgba.putalpha(Image.fromarray(np.tile(np.arange(48, dtype=np.uint8) * 5, (32, 1)), "L"))
    rgba.save(tmp_path / "a.png")
    columns = torch.arange(48, dtype=torch.float32) * 5 / 255
    plain = load_training_image(tmp_path / "a.png", (32, 32), _draws(crop=(1.0, 0)), True)
    flipped = load_training_image(tmp_path / "a.png", (32, 32), _draws(True, (1.0, 0)), True)
    assert plain.alpha.shape == (1, 32, 32) and plain.alpha.dtype == torch.float32
    torch.testing.assert_close(plain.alpha, columns[16:48].expand(1, 32, 32), rtol=0, atol=1e-7)
    flipped_columns = columns[16:48].flip(0).expand(1, 32, 32)
    torch.testing.assert_close(flipped.alpha, flipped_columns, rtol=0, atol=1e-7)
    # The pixels still composite on white: column x is a mix of (10, 20, 30) and white.
    assert not torch.equal(plain.pixels[:, :, 0], plain.pixels[:, :, -1])


def test_resized_alpha_stays_in_range_and_matches_a_bilinear_resize(tmp_path):
    rgba = _noise((40, 20), seed=6, mode="RGBA")
    rgba.save(tmp_path / "a.png")
    loaded = load_training_image(tmp_path / "a.png", (16, 16), with_alpha=True)
    expected = rgba.getchannel("A").resize((32, 16), Image.Resampling.BILINEAR).crop((8, 0, 24, 16))
    expected = torch.tensor(np.asarray(expected), dtype=torch.float32)[None] / 255
    assert torch.equal(loaded.alpha, expected)
    assert loaded.alpha.min() >= 0 and loaded.alpha.max() <= 1


def test_image_without_alpha_gives_an_all_ones_mask(tmp_path):
    _noise((30, 20), seed=7).save(tmp_path / "a.jpg")
    loaded = load_training_image(tmp_path / "a.jpg", (16, 16), with_alpha=True)
    assert torch.equal(loaded.alpha, torch.ones(1, 16, 16))
