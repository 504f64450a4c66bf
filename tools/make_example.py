"""Write the example shipped in examples/: a tiny SD 1.x model and a small shapes data set.

Deterministic: rerunning it rewrites byte-identical files (same library versions). Run from the
repository root:  python tools/make_example.py   (or: python -m tools.make_example)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = ROOT / "examples"
IMAGE_SIZE = 64
CLASS_TOKENS = "shape"

COLORS = {
    "red": (220, 40, 40),
    "blue": (40, 80, 220),
    "green": (40, 170, 60),
    "yellow": (240, 210, 40),
    "orange": (240, 140, 30),
    "purple": (140, 60, 180),
    "gray": (128, 128, 128),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
}

# (shape, colour, background, has a caption file)
TRAIN_IMAGES = (
    ("circle", "red", "white", True),
    ("square", "blue", "white", True),
    ("triangle", "green", "white", True),
    ("circle", "yellow", "black", True),
    ("square", "orange", "black", True),
    ("triangle", "purple", "yellow", True),
    ("diamond", "red", "blue", True),
    ("circle", "blue", "gray", True),
    # No caption file: the dataset falls back to the folder's class tokens ("shape").
    ("square", "green", "white", False),
)
REG_IMAGES = tuple(
    (shape, "gray", "white", False) for shape in ("circle", "square", "triangle", "diamond")
)


def _outline(shape: str, margin: int) -> list[tuple[int, int]]:
    """Corner points of a polygon shape inside the image, ``margin`` pixels from the edges."""
    lo, hi, mid = margin, IMAGE_SIZE - 1 - margin, (IMAGE_SIZE - 1) // 2
    if shape == "triangle":
        return [(mid, lo), (hi, hi), (lo, hi)]
    if shape == "diamond":
        return [(mid, lo), (hi, mid), (mid, hi), (lo, mid)]
    raise ValueError(f"unknown shape {shape!r}")


def draw_shape(shape: str, color: str, background: str):
    """One IMAGE_SIZE x IMAGE_SIZE RGB image of a filled shape on a plain background."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), COLORS[background])
    draw = ImageDraw.Draw(image)
    margin = IMAGE_SIZE // 6
    box = (margin, margin, IMAGE_SIZE - 1 - margin, IMAGE_SIZE - 1 - margin)
    if shape == "circle":
        draw.ellipse(box, fill=COLORS[color])
    elif shape == "square":
        draw.rectangle(box, fill=COLORS[color])
    else:
        draw.polygon(_outline(shape, margin), fill=COLORS[color])
    return image


def write_images(folder: Path, images: tuple) -> list[Path]:
    """Write PNGs (and .txt captions where wanted) into ``folder``; returns the written paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for shape, color, background, captioned in images:
        stem = f"{color}_{shape}_on_{background}"
        path = folder / f"{stem}.png"
        draw_shape(shape, color, background).save(path, format="PNG")
        written.append(path)
        if captioned:
            caption = folder / f"{stem}.txt"
            caption.write_text(
                f"a {color} {shape} on a {background} background\n", encoding="utf-8"
            )
            written.append(caption)
    return written


def make_example(out_dir: str | Path = EXAMPLES_DIR) -> list[Path]:
    """(Re)write ``out_dir``/tiny-sd1 and ``out_dir``/data; returns every generated file, sorted.

    Both folders are removed first so no stale file survives a change of this script.
    """
    from tests.kits.sd.tiny import save_tiny_model

    out_dir = Path(out_dir)
    for name in ("tiny-sd1", "data"):
        shutil.rmtree(out_dir / name, ignore_errors=True)
    save_tiny_model(out_dir / "tiny-sd1", "sd1", seed=0)
    write_images(out_dir / "data" / "train" / f"5_{CLASS_TOKENS}", TRAIN_IMAGES)
    write_images(out_dir / "data" / "reg" / f"1_{CLASS_TOKENS}", REG_IMAGES)
    return generated_files(out_dir)


def generated_files(out_dir: str | Path = EXAMPLES_DIR) -> list[Path]:
    """The files make_example owns under ``out_dir`` (README.md is written by hand)."""
    out_dir = Path(out_dir)
    files = [p for name in ("tiny-sd1", "data") for p in (out_dir / name).rglob("*")]
    return sorted(p for p in files if p.is_file())


def main() -> None:
    files = make_example(EXAMPLES_DIR)
    total = sum(p.stat().st_size for p in files)
    print(f"wrote {len(files)} files ({total / 1e6:.1f} MB) under {EXAMPLES_DIR}")


if __name__ == "__main__":
    # Run as a script, the repository root is not on the import path.
    sys.path.insert(0, str(ROOT))
    main()
