"""Every preset in configs/ validates, and opens with what it is for and its launch command."""

from pathlib import Path

import pytest

from library.config.loader import load_config

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.toml"))


def test_there_are_presets():
    assert len(PRESETS) >= 4


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_validates(preset, monkeypatch):
    monkeypatch.chdir(REPO)  # presets use paths relative to the repo, as users run them
    text = preset.read_text(encoding="utf-8")
    overrides = []
    if "train_data_dir" in text and "examples/" not in text:
        # user presets point at folders that exist only on the user's machine
        overrides = [
            ("train_data_dir", "examples/data/train"),
            ("reg_data_dir", "examples/data/reg"),
        ]
    config = load_config(str(preset), overrides)
    assert config.datasets and all(d.subsets for d in config.datasets)
    assert config.model.pretrained_model_name_or_path


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_says_what_it_is_for_and_how_to_launch(preset):
    head = preset.read_text(encoding="utf-8").split("\n\n[")[0]
    assert head.startswith("# ")
    assert "train_network.py --config" in head
