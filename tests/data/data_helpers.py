"""Helpers for the data tests: tiny images written with PIL."""

from __future__ import annotations

from pathlib import Path

from PIL import Image


def write_image(path: Path, color=(0, 0, 0), size=(16, 16), mode="RGB") -> Path:
    """A solid-color image file (the format follows the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


def index_color(i: int) -> tuple[int, int, int]:
    """A distinct, exactly representable color for image number i (< 50)."""
    return (5 * i, 250 - 5 * i, (37 * i) % 256)
