"""Names of sample image files, and the grid image of one sampling round."""

from __future__ import annotations

import math
import re
from pathlib import Path

from PIL import Image

SAMPLE_SUBDIR = "sample"
GRID_BACKGROUND = (0, 0, 0)


def sample_dir(output_dir: str | Path) -> Path:
    """Where sample images go: ``output_dir/sample`` (kohya's folder)."""
    return Path(output_dir) / SAMPLE_SUBDIR


def image_path(
    folder: Path, output_name: str, step: int, index: int, seed: int, suffix: str = ".png"
) -> Path:
    """``<output_name>_<step:06d>_<index:02d>_<seed>.png`` (``suffix``: a clip's ``.webp`` or
    ``.mp4``).

    kohya's name with the timestamp left out: the name then depends only on what the image
    depends on (step, prompt, seed), so a resumed run that samples the same step rewrites the
    same file instead of adding a near copy.
    """
    return folder / f"{output_name}_{step:06d}_{index:02d}_{seed}{suffix}"


def strip_path(clip: Path) -> Path:
    """The frame strip beside a sample clip: ``<clip's name>_strip.png``."""
    return clip.with_name(f"{clip.stem}_strip.png")


def grid_path(folder: Path, output_name: str, step: int) -> Path:
    """``<output_name>_<step:06d>_grid.png``."""
    return folder / f"{output_name}_{step:06d}_grid.png"


def is_sample_image(output_name: str, entry: str) -> bool:
    """Whether ``entry``, a name in the sample folder, is one of ``output_name``'s sample
    images, clips, frame strips or grids (image_path, strip_path, grid_path)."""
    sample = r"\d{2,}_-?\d+(\.png|\.webp|\.mp4|_strip\.png)"
    pattern = rf"{re.escape(output_name)}_\d{{6,}}_({sample}|grid\.png)"
    return re.fullmatch(pattern, entry) is not None


def grid_shape(count: int) -> tuple[int, int]:
    """(columns, rows) of a near-square grid for ``count`` images."""
    columns = max(1, math.ceil(math.sqrt(count)))
    return columns, max(1, math.ceil(count / columns))


def make_grid(images: list[Image.Image]) -> Image.Image:
    """The images in prompt order, row by row, each in the top-left of an equal cell.

    Cells are as large as the largest image, so prompts of different sizes fit; the rest of a
    cell stays black.
    """
    if not images:
        raise ValueError("make_grid needs at least one image")
    columns, rows = grid_shape(len(images))
    cell_w = max(img.width for img in images)
    cell_h = max(img.height for img in images)
    grid = Image.new("RGB", (columns * cell_w, rows * cell_h), GRID_BACKGROUND)
    for i, img in enumerate(images):
        row, column = divmod(i, columns)
        grid.paste(img.convert("RGB"), (column * cell_w, row * cell_h))
    return grid


def side_by_side(images: list[Image.Image]) -> Image.Image:
    """The images left to right at the height of the last one (each keeping its aspect
    ratio): an edit's reference images, its target, then the result."""
    height = images[-1].height
    scaled = [
        img if img.height == height else img.resize(
            (max(1, round(img.width * height / img.height)), height), Image.Resampling.LANCZOS
        )
        for img in images
    ]
    strip = Image.new("RGB", (sum(img.width for img in scaled), height), GRID_BACKGROUND)
    left = 0
    for img in scaled:
        strip.paste(img.convert("RGB"), (left, 0))
        left += img.width
    return strip
