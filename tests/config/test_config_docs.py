"""docs/config.md is generated from the schema and must be regenerated when it changes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator(name: str = "gen_config_docs"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_are_up_to_date():
    text = _generator().render_docs()
    current = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert current == text, "docs/config.md is stale: run python tools/gen_config_docs.py"


def test_docs_cover_every_key():
    from library.config import kohya
    from library.config.overrides import DATASET_KEYS, SUBSET_KEYS
    from library.config.schema import field_sections

    text = _generator().render_docs()
    keys = list(field_sections()) + list(DATASET_KEYS + SUBSET_KEYS) + list(kohya.UNSUPPORTED)
    assert [k for k in keys if f"`{k}`" not in text] == []


def test_the_sd_scripts_inventory_table_is_up_to_date():
    current = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    text = _generator("gen_compat_docs").render_docs(current)
    assert current == text, "docs/compatibility.md is stale: run python tools/gen_compat_docs.py"


def test_the_inventory_table_has_every_sd_scripts_option():
    from tests.config.kohya_arguments import KOHYA_SCRIPTS

    table = _generator("gen_compat_docs").render_table()
    rows = {line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()}
    assert {f"`{key}`" for key in KOHYA_SCRIPTS} <= rows
