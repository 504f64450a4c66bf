from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from library.data.images import check_image, load_image
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
