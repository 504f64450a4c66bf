"""Sample prompts of edit models: reference images (--ci, repeated for several; musubi-tuner's
option) and the expected image (--ti), resolved from the prompts file's folder, checked when the
file is read, and shown beside the result."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from library.config.sampling_schema import SamplingSection
from library.errors import ConfigError
from library.sampling.grid import side_by_side
from library.sampling.prompts import load_prompts


def _image(path, size=(32, 16), color=(255, 0, 0)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def _load(path):
    return load_prompts(path, SamplingSection(), 0)


def test_reference_options_resolve_from_the_prompts_folder(tmp_path, monkeypatch):
    folder = tmp_path / "prompts"
    first, second = _image(folder / "ref" / "a.png"), _image(folder / "b.png")
    target = _image(folder / "want.png")
    path = folder / "p.txt"
    path.write_text("make it blue --ci ref/a.png --ci b.png --ti want.png --w 64\nplain\n")
    monkeypatch.chdir(tmp_path)  # relative to the prompts file, not to the current folder
    edit, plain = _load(path)
    assert edit.prompt == "make it blue" and edit.width == 64
    assert edit.references == (first, second) and edit.target_image == target
    assert plain.references == () and plain.target_image is None


def test_reference_keys_in_json_take_one_path_or_a_list(tmp_path):
    _image(tmp_path / "a.png")
    _image(tmp_path / "b.png")
    path = tmp_path / "p.json"
    path.write_text(json.dumps([
        {"prompt": "one", "control_image": "a.png"},
        {"prompt": "two", "control_image": ["a.png", "b.png"]},
    ]))  # fmt: skip
    one, two = _load(path)
    assert [p.name for p in one.references] == ["a.png"]
    assert [p.name for p in two.references] == ["a.png", "b.png"]


@pytest.mark.parametrize(
    "line, message",
    [
        ("x --ci missing.png", r"--ci missing\.png: no image at .*missing\.png"),
        ("x --ti notes.txt", r"--ti: .*notes\.txt"),
    ],
)
def test_a_missing_or_unreadable_reference_is_named_with_its_line(tmp_path, line, message):
    (tmp_path / "notes.txt").write_text("not an image")
    path = tmp_path / "p.txt"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=rf"p\.txt, line 1: {message}"):
        _load(path)


def test_side_by_side_scales_to_the_result_height_in_order():
    reference = Image.new("RGB", (40, 20), (255, 0, 0))
    result = Image.new("RGB", (30, 40), (0, 0, 255))
    strip = side_by_side([reference, result])
    assert strip.size == (80 + 30, 40)
    assert strip.getpixel((10, 10)) == (255, 0, 0) and strip.getpixel((100, 10)) == (0, 0, 255)
