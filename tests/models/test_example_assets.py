"""The committed example and test assets are exactly what their generator scripts write."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tools.make_example import EXAMPLES_DIR, generated_files, make_example
from tools.make_test_assets import ASSETS_DIR, asset_writers, make_test_assets


def digests(root: Path, files: list[Path]) -> dict[str, str]:
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def fresh_example(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("example")
    return root, digests(root, make_example(root))


def test_example_generator_is_deterministic(fresh_example, tmp_path):
    _, first = fresh_example
    second = digests(tmp_path, make_example(tmp_path))
    assert first == second


def test_example_layout(fresh_example):
    root, files = fresh_example
    train = sorted(n for n in files if n.startswith("data/train/5_shape/"))
    images = [n for n in train if n.endswith(".png")]
    captions = {n[: -len(".txt")] for n in train if n.endswith(".txt")}
    assert len(images) == 9 and len(captions) == 8
    assert [n for n in images if n[: -len(".png")] not in captions] == [
        "data/train/5_shape/green_square_on_white.png"
    ]
    reg = [n for n in files if n.startswith("data/reg/1_shape/")]
    assert len(reg) == 4 and all(n.endswith(".png") for n in reg)
    assert "tiny-sd1/model_index.json" in files
    assert sum((root / n).stat().st_size for n in files) < 5_000_000


def test_example_images_are_64px_rgb_and_captions_name_them(fresh_example):
    from PIL import Image

    root, files = fresh_example
    for name in files:
        if name.startswith("data/") and name.endswith(".png"):
            with Image.open(root / name) as image:
                assert image.size == (64, 64) and image.mode == "RGB", name
            caption = root / name.replace(".png", ".txt")
            if caption.exists():
                color, shape, _, background = Path(name).stem.split("_")
                expected = f"a {color} {shape} on a {background} background"
                assert caption.read_text().strip() == expected


def test_committed_example_matches_generator(fresh_example):
    _, fresh = fresh_example
    committed = digests(EXAMPLES_DIR, generated_files(EXAMPLES_DIR))
    assert committed == fresh, "examples/ drifted from its generator: run tools/make_example.py"


def test_committed_test_assets_match_generator(tmp_path):
    fresh = digests(tmp_path, make_test_assets(tmp_path))
    committed_files = sorted(
        p for name in asset_writers() for p in (ASSETS_DIR / name).rglob("*") if p.is_file()
    )
    committed = digests(ASSETS_DIR, committed_files)
    assert fresh and committed == fresh, "tests/assets drifted: run tools/make_test_assets.py"
