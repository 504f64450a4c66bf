"""The shared loading modules (the one plan system, the family spec and its loader, the folder
loader, the shared part readers, name tables, text-encoder kinds) import no family package: a
family is read from its spec, never by a shared module knowing it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ROOT / "library" / "models" / "families"
SHARED = (
    "library/models/plans.py",
    "library/models/checkpoint_parts.py",
    "library/models/released_configs.py",
    "library/models/patch_tokens.py",
    "library/models/families/spec.py",
    "library/models/families/spec_loader.py",
    "library/models/families/folder_loader.py",
    "library/models/families/file_plans.py",
    "library/models/families/name_table.py",
    "library/models/families/mistral3_file.py",
    "library/models/families/batchnorm_vae_file.py",
    "library/networks/table_modules.py",
    *(p.relative_to(ROOT).as_posix() for p in (ROOT / "library/models/text_encoders").glob("*.py")),
)


def _family_packages() -> set[str]:
    return {p.parent.name for p in FAMILIES.glob("*/entry.py")}


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def test_shared_loading_modules_import_no_family():
    packages = _family_packages()
    assert {"chroma", "flux", "zimage"} <= packages
    naming = {
        module: name
        for module in SHARED
        for name in _imports(ROOT / module)
        if name.startswith("library.models.families.")
        and name.split(".")[3] in packages
    }
    assert not naming, f"shared modules import a family: {naming}"
