"""Every image mode Pillow opens loads as the 8-bit RGB (and alpha) the images module documents.

Each case builds a source array, writes it as a file in that mode (or, for modes no format
saves, builds the PIL image in memory), loads it with the project's loader and compares it with
a numpy reference computed here from the source array.
"""

from __future__ import annotations

import colorsys
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from library.data.images import (
    load_image,
    load_training_image,
    read_image_header,
    rgb_and_alpha,
)
from library.errors import DataError

W, H = 7, 5  # not square, so a transposed result shows
STEP = 1 + 1e-3  # one 8-bit step, where Pillow's rounding differs from the reference


def _rng(seed):
    return np.random.default_rng(seed)


def _u8(shape, seed, low=0, high=256):
    return _rng(seed).integers(low, high, shape, dtype=np.uint8)


def _u16(shape, seed):
    return _rng(seed).integers(0, 65536, shape, dtype=np.uint16)


def _grey_rgb(levels):
    """An (H, W) array of 0..255 levels as (H, W, 3)."""
    return np.repeat(np.asarray(levels, dtype=np.float64)[..., None], 3, axis=2)


def _on_white(rgb, alpha):
    """Reference compositing on white, in floats: c * a + 255 * (1 - a), a in [0, 1]."""
    a = np.asarray(alpha, dtype=np.float64)[..., None] / 255
    return np.asarray(rgb, dtype=np.float64) * a + 255 * (1 - a)


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def _png(samples: np.ndarray, color_type: int, depth: int, trns: bytes | None = None) -> bytes:
    """A PNG written by hand, for bit depths and colour keys PIL cannot write.

    `samples` is (H, W, channels) or (H, W) of sample values; below 8 bits they are packed.
    """
    height, width = samples.shape[:2]
    rows = []
    for row in samples.reshape(height, -1):
        if depth == 16:
            raw = row.astype(">u2").tobytes()
        elif depth == 8:
            raw = row.astype(np.uint8).tobytes()
        else:
            bits = "".join(format(int(v), f"0{depth}b") for v in row)
            bits += "0" * (-len(bits) % 8)
            raw = int(bits, 2).to_bytes(len(bits) // 8, "big")
        rows.append(b"\x00" + raw)  # filter type 0 (none)
    header = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    chunks = _chunk(b"IHDR", header)
    if trns is not None:
        chunks += _chunk(b"tRNS", trns)
    chunks += _chunk(b"IDAT", zlib.compress(b"".join(rows))) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def _frombytes(mode, array):
    return Image.frombytes(mode, (array.shape[1], array.shape[0]), array.tobytes())


def _lab_to_srgb(lightness8, a, b):
    """8-bit Lab (L 0..255 for 0..100; a and b signed) to sRGB 0..255: D50 Lab to XYZ,
    Bradford-adapted to D65, then the sRGB matrix and curve."""
    lightness = lightness8 / 255 * 100
    fy = (lightness + 16) / 116
    f = np.stack([fy + a / 500, fy, fy - b / 200], axis=-1)
    epsilon, kappa = 216 / 24389, 24389 / 27
    xyz = np.where(f**3 > epsilon, f**3, (116 * f - 16) / kappa)
    xyz[..., 1] = np.where(lightness > kappa * epsilon, fy**3, lightness / kappa)
    xyz *= np.array([0.9642, 1.0, 0.8249])  # D50 white
    bradford = np.array(
        [
            [0.9555766, -0.0230393, 0.0631636],
            [-0.0282895, 1.0099416, 0.0210077],
            [0.0122982, -0.0204830, 1.3299098],
        ]
    )
    to_linear = np.array(
        [
            [3.2404542, -1.5371385, -0.4985314],
            [-0.9692660, 1.8760108, 0.0415560],
            [0.0556434, -0.2040259, 1.0572252],
        ]
    )
    linear = np.clip(xyz @ bradford.T @ to_linear.T, 0, 1)
    srgb = np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * linear ** (1 / 2.4) - 0.055)
    return srgb * 255


# --- the cases: (source written to disk or built in memory, reference RGB, reference alpha) ---


def _case_1(tmp):
    bits = _u8((H, W), 1, 0, 2) * 255
    Image.fromarray(bits).convert("1", dither=Image.Dither.NONE).save(tmp / "a.png")
    return tmp / "a.png", "1", _grey_rgb(bits), None


def _case_l(tmp):
    grey = _u8((H, W), 2)
    Image.fromarray(grey).save(tmp / "a.png")
    return tmp / "a.png", "L", _grey_rgb(grey), None


def _case_la(tmp):
    la = _u8((H, W, 2), 3)
    _frombytes("LA", la).save(tmp / "a.png")
    return tmp / "a.png", "LA", _on_white(_grey_rgb(la[..., 0]), la[..., 1]), la[..., 1]


def _case_la_premultiplied(tmp):
    alpha = _u8((H, W), 4)
    grey = (_u8((H, W), 5) * (alpha / 255)).astype(np.uint8)  # premultiplied: grey <= alpha
    image = _frombytes("La", np.stack([grey, alpha], axis=-1))
    # On white: premultiplied g + 255 * (1 - a).
    return image, "La", _grey_rgb(grey + 255.0 - alpha), alpha


def _palette(seed):
    return _u8((256, 3), seed)


def _case_p(tmp):
    palette, index = _palette(6), _u8((H, W), 7)
    image = Image.fromarray(index)
    image = image.convert("P") if image.mode != "P" else image
    image = Image.frombytes("P", (W, H), index.tobytes())
    image.putpalette(palette.tobytes())
    image.save(tmp / "a.png")
    return tmp / "a.png", "P", palette[index].astype(np.float64), None


def _keyed_palette_image(seed):
    palette, index = _palette(seed), _u8((H, W), seed + 1)
    key = int(index[0, 0])  # one palette index is transparent, and it occurs
    image = Image.frombytes("P", (W, H), index.tobytes())
    image.putpalette(palette.tobytes())
    alpha = np.where(index == key, 0, 255)
    return image, key, _on_white(palette[index], alpha), alpha


def _case_p_transparency_png(tmp):
    image, key, rgb, alpha = _keyed_palette_image(8)
    image.save(tmp / "a.png", transparency=key)
    return tmp / "a.png", "P", rgb, alpha


def _case_p_transparency_gif(tmp):
    image, key, rgb, alpha = _keyed_palette_image(10)
    image.save(tmp / "a.gif", transparency=key, optimize=False)
    return tmp / "a.gif", "P", rgb, alpha


def _case_p_alpha_palette(tmp):
    palette, index = _u8((256, 4), 12), _u8((H, W), 13)
    image = Image.frombytes("P", (W, H), index.tobytes())
    image.putpalette(palette.tobytes(), rawmode="RGBA")
    image.save(tmp / "a.png")  # written as a PNG palette with a tRNS alpha per entry
    rgba = palette[index]
    return tmp / "a.png", "P", _on_white(rgba[..., :3], rgba[..., 3]), rgba[..., 3]


def _case_pa(tmp):
    palette, pa = _palette(14), _u8((H, W, 2), 15)
    image = _frombytes("PA", pa)
    image.putpalette(palette.tobytes())
    image.save(tmp / "a.tiff")
    alpha = pa[..., 1]
    return tmp / "a.tiff", "PA", _on_white(palette[pa[..., 0]], alpha), alpha


def _case_rgb(tmp):
    rgb = _u8((H, W, 3), 16)
    _frombytes("RGB", rgb).save(tmp / "a.png")
    return tmp / "a.png", "RGB", rgb.astype(np.float64), None


def _case_rgba(tmp):
    rgba = _u8((H, W, 4), 17)
    _frombytes("RGBA", rgba).save(tmp / "a.png")
    return tmp / "a.png", "RGBA", _on_white(rgba[..., :3], rgba[..., 3]), rgba[..., 3]


def _case_rgba_premultiplied(tmp):
    alpha = _u8((H, W), 18)
    rgb = (_u8((H, W, 3), 19) * (alpha[..., None] / 255)).astype(np.uint8)
    image = _frombytes("RGBa", np.concatenate([rgb, alpha[..., None]], axis=-1))
    return image, "RGBa", rgb + 255.0 - alpha[..., None], alpha


def _case_rgbx(tmp):
    rgbx = _u8((H, W, 4), 20)
    return _frombytes("RGBX", rgbx), "RGBX", rgbx[..., :3].astype(np.float64), None


def _case_cmyk(tmp):
    cmyk = _u8((H, W, 4), 21).astype(np.float64)
    _frombytes("CMYK", cmyk.astype(np.uint8)).save(tmp / "a.tiff")
    rgb = (255 - cmyk[..., :3]) * (255 - cmyk[..., 3:]) / 255
    return tmp / "a.tiff", "CMYK", rgb, None


def _case_ycbcr(tmp):
    ycc = _u8((H, W, 3), 22, 60, 190).astype(np.float64)  # keeps the result inside 0..255
    _frombytes("YCbCr", ycc.astype(np.uint8)).save(tmp / "a.tiff")
    y, cb, cr = ycc[..., 0], ycc[..., 1] - 128, ycc[..., 2] - 128
    rgb = np.stack(
        [y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], axis=-1
    )  # JFIF
    return tmp / "a.tiff", "YCbCr", np.clip(rgb, 0, 255), None


def _case_lab(tmp):
    # TIFF's CIELab bytes, which are also Pillow's raw "LAB" bytes: a and b are signed.
    lightness = _u8((H, W), 23)
    ab = _rng(24).integers(-40, 41, (H, W, 2)).astype(np.int8)
    raw = np.concatenate([lightness[..., None], ab.view(np.uint8)], axis=-1)
    _frombytes("LAB", raw).save(tmp / "a.tiff")
    reference = _lab_to_srgb(lightness.astype(float), ab[..., 0] * 1.0, ab[..., 1] * 1.0)
    return tmp / "a.tiff", "LAB", reference, None


def _case_hsv(tmp):
    hsv = _u8((H, W, 3), 26)
    rgb = np.array(
        [[colorsys.hsv_to_rgb(*(pixel / 255)) for pixel in row] for row in hsv.astype(float)]
    )
    return _frombytes("HSV", hsv), "HSV", rgb * 255, None


def _sixteen_bit_grey(seed):
    return _u16((H, W), seed)


def _case_i16_png(tmp):
    values = _sixteen_bit_grey(27)
    Image.fromarray(values).save(tmp / "a.png")  # uint16 -> "I;16", written as a 16-bit PNG
    return tmp / "a.png", "I;16", _grey_rgb(values / 65535 * 255), None


def _case_i16b_tiff(tmp):
    values = _sixteen_bit_grey(28)
    Image.frombytes("I;16B", (W, H), values.astype(">u2").tobytes()).save(tmp / "a.tiff")
    return tmp / "a.tiff", "I;16B", _grey_rgb(values / 65535 * 255), None


def _case_i16l(tmp):
    values = _sixteen_bit_grey(29)
    image = Image.frombytes("I;16L", (W, H), values.astype("<u2").tobytes())
    return image, "I;16L", _grey_rgb(values / 65535 * 255), None


def _case_i16n(tmp):
    values = _sixteen_bit_grey(30)
    image = Image.frombytes("I;16N", (W, H), values.astype("=u2").tobytes())
    return image, "I;16N", _grey_rgb(values / 65535 * 255), None


def _case_i32_tiff(tmp):
    values = _u16((H, W), 31).astype(np.int32)
    Image.fromarray(values).save(tmp / "a.tiff")
    return tmp / "a.tiff", "I", _grey_rgb(values / 65535 * 255), None


def _case_i32_pgm(tmp):
    values = _u16((H, W), 32)
    (tmp / "a.pgm").write_bytes(f"P5 {W} {H} 65535\n".encode() + values.astype(">u2").tobytes())
    return tmp / "a.pgm", "I", _grey_rgb(values / 65535 * 255), None


def _case_float_tiff(tmp):
    values = _rng(33).uniform(-0.2, 1.2, (H, W)).astype(np.float32)  # outside [0, 1] is clipped
    Image.fromarray(values).save(tmp / "a.tiff")
    return tmp / "a.tiff", "F", _grey_rgb(np.clip(values, 0, 1) * 255), None


def _case_rgb16_png(tmp):
    values = _u16((H, W, 3), 34)
    (tmp / "a.png").write_bytes(_png(values, 2, 16))
    # Pillow keeps the high byte; it is within a step of v / 65535 * 255 (checked below too).
    return tmp / "a.png", "RGB", (values // 256).astype(np.float64), None


def _case_rgba16_png(tmp):
    values = _u16((H, W, 4), 35)
    (tmp / "a.png").write_bytes(_png(values, 6, 16))
    high = values // 256
    return tmp / "a.png", "RGBA", _on_white(high[..., :3], high[..., 3]), high[..., 3]


def _case_la16_png(tmp):
    values = _u16((H, W, 2), 36)
    (tmp / "a.png").write_bytes(_png(values, 4, 16))
    high = values // 256
    return tmp / "a.png", "RGBA", _on_white(_grey_rgb(high[..., 0]), high[..., 1]), high[..., 1]


def _case_grey16_colour_key(tmp):
    values = _u16((H, W), 37)
    key = int(values[1, 2])
    (tmp / "a.png").write_bytes(_png(values, 0, 16, struct.pack(">H", key)))
    alpha = np.where(values == key, 0, 255)
    return tmp / "a.png", "I;16", _on_white(_grey_rgb(values / 65535 * 255), alpha), alpha


def _low_depth_grey_key(tmp, depth, seed):
    values = _rng(seed).integers(0, 2**depth, (H, W))
    key = int(values[0, 1])
    (tmp / "a.png").write_bytes(_png(values, 0, depth, struct.pack(">H", key)))
    levels = values * 255 / (2**depth - 1)
    alpha = np.where(values == key, 0, 255)
    return tmp / "a.png", "L", _on_white(_grey_rgb(levels), alpha), alpha


def _case_grey2_colour_key(tmp):
    return _low_depth_grey_key(tmp, 2, 38)


def _case_grey4_colour_key(tmp):
    return _low_depth_grey_key(tmp, 4, 39)


def _case_rgb8_colour_key(tmp):
    rgb = _u8((H, W, 3), 40)
    key = rgb[2, 3].copy()
    (tmp / "a.png").write_bytes(_png(rgb, 2, 8, struct.pack(">HHH", *key.tolist())))
    alpha = np.where((rgb == key).all(axis=-1), 0, 255)
    return tmp / "a.png", "RGB", _on_white(rgb, alpha), alpha


def _case_rgb16_colour_key(tmp):
    values = _u16((H, W, 3), 41)
    key = values[3, 4].copy()
    (tmp / "a.png").write_bytes(_png(values, 2, 16, struct.pack(">HHH", *key.tolist())))
    # Matched on the high bytes Pillow keeps (documented); random values share them rarely.
    high = values // 256
    alpha = np.where((high == key // 256).all(axis=-1), 0, 255)
    assert (alpha == 0).sum() == 1
    return tmp / "a.png", "RGB", _on_white(high, alpha), alpha


CASES = {
    name[len("_case_") :]: case for name, case in globals().items() if name.startswith("_case_")
}


def _load(source: Path | Image.Image) -> tuple[np.ndarray, np.ndarray]:
    """(RGB (H, W, 3), alpha (H, W)) in 0..255 as the trainer gets them."""
    if isinstance(source, Image.Image):
        rgb, alpha = rgb_and_alpha(source)
        opaque = np.full((source.height, source.width), 255.0)
        return np.asarray(rgb, dtype=np.float64), (
            opaque if alpha is None else np.asarray(alpha, dtype=np.float64)
        )
    loaded = load_training_image(source, (W, H), with_alpha=True)
    rgb = (loaded.pixels.permute(1, 2, 0).double().numpy() + 1) * 127.5
    return rgb, loaded.alpha[0].double().numpy() * 255


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_mode_loads_as_the_documented_rgb_and_alpha(tmp_path, name):
    source, mode, reference_rgb, reference_alpha = CASES[name](tmp_path)
    if isinstance(source, Path):
        with Image.open(source) as opened:
            assert opened.mode == mode  # the mode this Pillow version opens the file as
    else:
        assert source.mode == mode
    rgb, alpha = _load(source)
    assert rgb.shape == (H, W, 3)
    np.testing.assert_allclose(rgb, reference_rgb, rtol=0, atol=STEP)
    expected_alpha = np.full((H, W), 255.0) if reference_alpha is None else reference_alpha
    np.testing.assert_allclose(alpha, expected_alpha, rtol=0, atol=STEP)


def test_sixteen_bit_colour_is_within_a_step_of_full_precision(tmp_path):
    source, _, _, _ = _case_rgb16_png(tmp_path)
    values = _u16((H, W, 3), 34)
    rgb, _ = _load(source)
    np.testing.assert_allclose(rgb, values / 65535 * 255, rtol=0, atol=STEP)


def test_a_sixteen_bit_grey_png_keeps_its_brightness(tmp_path):
    # The bug this guards against: Pillow's convert("RGB") clips 16-bit values, so an image of
    # mean 129/255 of full scale loaded as almost white (mean 254.6).
    values = _rng(50).normal(129 * 257, 40 * 257, (64, 48)).clip(0, 65535).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "grey16.png")
    with Image.open(tmp_path / "grey16.png") as opened:
        assert opened.mode == "I;16"
    expected = values / 65535 * 255
    assert abs(expected.mean() - 129) < 1
    pixels = load_image(tmp_path / "grey16.png", (48, 64))
    loaded = (pixels.double().numpy() + 1) * 127.5
    assert loaded.shape == (3, 64, 48)
    np.testing.assert_allclose(loaded, np.broadcast_to(expected, (3, 64, 48)), atol=STEP)
    assert abs(loaded.mean() - expected.mean()) < 0.5
    # Resized (LANCZOS to half the size) it keeps the mean too.
    half = (load_image(tmp_path / "grey16.png", (24, 32)).double().numpy() + 1) * 127.5
    assert abs(half.mean() - expected.mean()) < 1


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        (np.full((H, W), 70000, dtype=np.int32), r"a\.tiff has 32-bit pixel values .*70000"),
        (np.full((H, W), -5, dtype=np.int32), r"a\.tiff has 32-bit pixel values from -5"),
        (np.full((H, W), np.nan, dtype=np.float32), r"a\.tiff has NaN"),
    ],
)
def test_pixel_values_without_an_8_bit_meaning_are_errors(tmp_path, values, pattern):
    Image.fromarray(values).save(tmp_path / "a.tiff")
    for read in (read_image_header, lambda path: load_image(path, (W, H))):
        with pytest.raises(DataError, match=pattern) as error:
            read(tmp_path / "a.tiff")
        assert "save it with 8 or 16 bits per channel" in str(error.value)


# --- animated files: the first frame is trained, and the plan counts them ---------------------


def _animated_files(folder: Path) -> dict[str, tuple[np.ndarray, int]]:
    """GIF, WebP and APNG files of several different frames: name -> (first frame RGB, frames)."""
    folder.mkdir(parents=True, exist_ok=True)
    palette = _palette(60)
    indices = [_u8((H, W), 61 + i) for i in range(3)]
    gif = [Image.frombytes("P", (W, H), index.tobytes()) for index in indices[:2]]
    for frame in gif:
        frame.putpalette(palette.tobytes())
    gif[0].save(folder / "a.gif", save_all=True, append_images=gif[1:], optimize=False)
    rgbs = [_u8((H, W, 3), 70 + i) for i in range(3)]
    frames = [_frombytes("RGB", rgb) for rgb in rgbs]
    frames[0].save(folder / "b.webp", save_all=True, append_images=frames[1:], lossless=True)
    frames[0].save(folder / "c.apng", save_all=True, append_images=frames[1:2])
    return {"a.gif": (palette[indices[0]], 2), "b.webp": (rgbs[0], 3), "c.apng": (rgbs[0], 2)}


def test_animated_images_train_their_first_frame(tmp_path):
    for name, (first, frames) in _animated_files(tmp_path).items():
        assert read_image_header(tmp_path / name).frames == frames
        rgb, alpha = _load(tmp_path / name)
        np.testing.assert_array_equal(rgb.round(), first)  # lossless formats: exact
        assert (alpha == 255).all()
    _frombytes("RGB", _u8((H, W, 3), 80)).save(tmp_path / "still.png")
    header = read_image_header(tmp_path / "still.png")
    assert (header.frames, header.animated, header.size) == (1, False, (W, H))


def test_the_plan_counts_animated_images(tmp_path):
    from library.config.dataset_schema import DatasetConfig, SubsetConfig
    from library.data.dataset import TrainData
    from library.data.plan import plan_lines

    folder = tmp_path / "1_anim"
    _animated_files(folder)
    _frombytes("RGB", _u8((H, W, 3), 81)).save(folder / "still.png")
    subset = SubsetConfig(image_dir=str(folder), class_tokens="x")
    data = TrainData([DatasetConfig(resolution=64, subsets=[subset])], seed=0)
    assert data.num_train_images == 4
    expected = "  3 animated images: first frame used (1_anim/a.gif, 1_anim/b.webp, 1_anim/c.apng)"
    assert expected in plan_lines(data)
