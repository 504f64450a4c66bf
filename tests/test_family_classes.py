"""No family package's class derives from another family package's class.

A family package (a folder of library/models/families/ with an ``__init__.py``) builds on the
shared parts (library/models/families/*.py, library/models/...), never on another family's
classes: a variant of another family (an edit release such as FLUX.1 Kontext or Qwen-Image-Edit)
is a registry entry with that family's class, its own data and hooks
(library/models/families/edit_variant.py), and the registry tells the families' instances apart
by their entry (registry.entry_of), not by their class. The check reads the source: a class
whose base is a name imported from another family package (``from ...families.flux.family
import FluxFamily``, or ``from ...families.flux import family`` and ``family.FluxFamily``)
fails, naming the class and the base.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ROOT / "library" / "models" / "families"
_PREFIX = "library.models.families."


def family_packages() -> list[str]:
    """The family packages' names (flux, kontext, ...)."""
    return sorted(p.name for p in FAMILIES.iterdir() if (p / "__init__.py").is_file())


def _package_of(module: str, packages: set[str]) -> str | None:
    """The family package ``module`` (a dotted name) is in, None for a shared module."""
    if not module.startswith(_PREFIX):
        return None
    head = module[len(_PREFIX) :].split(".")[0]
    return head if head in packages else None


def _imported_packages(tree: ast.Module, packages: set[str]) -> dict[str, str]:
    """Local name -> the family package it was imported from (a class or a module of it)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                # "from families.flux import family" names a module of flux too
                owner = _package_of(f"{node.module}.{alias.name}", packages)
                if owner is not None:
                    found[alias.asname or alias.name] = owner
        elif isinstance(node, ast.Import):
            for alias in node.names:
                owner = _package_of(alias.name, packages)
                if owner is not None and alias.asname:
                    found[alias.asname] = owner
    return found


def _base_name(base: ast.expr) -> str | None:
    """The local name a class's base starts from (``FluxFamily``, ``family`` of
    ``family.FluxFamily``)."""
    while isinstance(base, ast.Attribute):
        base = base.value
    if isinstance(base, ast.Subscript):  # Generic[...]-style bases
        return _base_name(base.value)
    return base.id if isinstance(base, ast.Name) else None


def foreign_bases(source: str, own: str, packages: set[str]) -> list[str]:
    """"Class(base): base is <package>'s" for each class in ``source`` (a module of the family
    package ``own``) whose base comes from another family package."""
    tree = ast.parse(source)
    imported = _imported_packages(tree, packages)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            owner = imported.get(_base_name(base) or "")
            if owner is not None and owner != own:
                found.append(f"{node.name}({ast.unparse(base)}): a class of {owner}")
    return found


def test_no_family_class_derives_from_another_familys():
    packages = set(family_packages())
    found = [
        f"{path.relative_to(ROOT)}: {problem}"
        for package in sorted(packages)
        for path in sorted((FAMILIES / package).rglob("*.py"))
        for problem in foreign_bases(path.read_text(encoding="utf-8"), package, packages)
    ]
    assert not found, (
        "a family package's class derives from another family package's class; declare the "
        "variant as a registry entry with that family's class and an EditVariant "
        f"(library/models/families/edit_variant.py): {found}"
    )


def test_a_derived_family_class_is_found():
    packages = {"flux", "kontext"}
    by_name = (
        "from library.models.families.flux.family import FluxFamily as Base\n"
        "class KontextFamily(Base):\n    pass\n"
    )
    by_module = (
        "from library.models.families.flux import family\n"
        "class KontextFamily(family.FluxFamily):\n    pass\n"
    )
    shared = (
        "from library.models.families.transformer_family import TransformerFamily\n"
        "from library.models.families.flux.family import FluxFamily\n"
        "class KontextFamily(TransformerFamily):\n    pass\n"
    )
    assert foreign_bases(by_name, "kontext", packages) == ["KontextFamily(Base): a class of flux"]
    assert foreign_bases(by_module, "kontext", packages) == [
        "KontextFamily(family.FluxFamily): a class of flux"
    ]
    assert foreign_bases(by_name, "flux", packages) == []  # its own package's class
    assert foreign_bases(shared, "kontext", packages) == []  # a shared base class
