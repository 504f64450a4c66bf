"""The batch's size-conditioning entries (original size, crop top-left, target size) for SDXL."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData

TARGET_W, TARGET_H = 96, 64
# name -> (stored width, height, EXIF orientation, expected original (h, w), crop (top, left)),
# worked out by hand for the 96x64 (w x h) target: cover-resize keeping the aspect, crop center.
CASES = {
    # 100x60: scale max(0.96, 1.067) = 1.067 -> 107x64, crop left (107 - 96) // 2 = 5
    "wide": (100, 60, None, (60, 100), (0, 5)),
    # 40x90: scale max(2.4, 0.71) = 2.4 -> 96x216, crop top (216 - 64) // 2 = 76
    "tall": (40, 90, None, (90, 40), (76, 0)),
    # stored 30x20, shown rotated (EXIF 6) as 20x30: scale 4.8 -> 96x144, crop top 40
    "rotated": (30, 20, 6, (30, 20), (40, 0)),
}


def _gradient(width: int, height: int) -> Image.Image:
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    pixels = np.stack([x, y, (x + y) / 2], -1).astype(np.uint8)
    return Image.fromarray(pixels)


def _write(folder, name, width, height, orientation):
    image = _gradient(width, height)
    if orientation is None:
        image.save(folder / f"{name}.png")
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        image.save(folder / f"{name}.jpg", exif=exif, quality=95)
    (folder / f"{name}.txt").write_text(name, encoding="utf-8")


def _expected_pixels(folder, name, original, crop) -> torch.Tensor:
    """The training crop cut by hand at the expected offsets."""
    from PIL import ImageOps

    path = next(folder.glob(f"{name}.*[gG]"))
    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")
    assert (image.height, image.width) == original
    scale = max(TARGET_W / image.width, TARGET_H / image.height)
    size = (max(TARGET_W, round(image.width * scale)), max(TARGET_H, round(image.height * scale)))
    if size != image.size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    top, left = crop
    cut = np.asarray(image.crop((left, top, left + TARGET_W, top + TARGET_H)), dtype=np.float32)
    return torch.from_numpy(cut).permute(2, 0, 1) / 127.5 - 1.0


def test_batch_has_sdxl_size_entries(tmp_path):
    for name, (width, height, orientation, _, _) in CASES.items():
        _write(tmp_path, name, width, height, orientation)
    subset = SubsetConfig(image_dir=str(tmp_path), class_tokens="x", caption_extension=".txt")
    config = DatasetConfig(batch_size=1, resolution=(TARGET_W, TARGET_H), subsets=[subset])
    data = TrainData([config], seed=0)
    seen = set()
    for batch in data.loader(epoch=0, rank=0):
        name = batch["captions"][0]
        _, _, _, original, crop = CASES[name]
        assert batch["original_sizes"].tolist() == [list(original)]
        assert batch["crop_top_lefts"].tolist() == [list(crop)]
        assert batch["target_sizes"].tolist() == [[TARGET_H, TARGET_W]]
        for key in ("original_sizes", "crop_top_lefts", "target_sizes"):
            assert batch[key].dtype == torch.long and batch[key].shape == (1, 2)
        expected = _expected_pixels(tmp_path, name, original, crop)
        torch.testing.assert_close(batch["pixel_values"][0], expected, rtol=0, atol=1e-6)
        seen.add(name)
    assert seen == set(CASES)
