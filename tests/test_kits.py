"""tests.kits.kit_of finds a family's test kit by the family's name, outside library/."""

from __future__ import annotations

import importlib

import pytest

import tests.kits
from library.models.families import registry
from tests.kits import kit_of, registered_kit


def test_a_family_kit_is_found_by_its_name():
    for entry in registry.families():
        module = importlib.import_module(f"tests.kits.{entry.name}.kit")
        assert kit_of(entry.name) is module.KIT


def test_a_family_without_a_kit_folder_has_none():
    assert kit_of("made-up") is None
    with registered_kit("made-up", "its kit"):
        assert kit_of("made-up") == "its kit"
    assert kit_of("made-up") is None


def test_a_kit_that_fails_to_import_is_not_taken_for_no_kit(monkeypatch):
    def broken(name):
        raise ModuleNotFoundError("No module named 'torchvision'", name="torchvision")

    monkeypatch.setattr(tests.kits.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="torchvision"):
        kit_of("sd")
