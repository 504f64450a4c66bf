"""Library modules import each other at the top of the module, never inside a function.

A module's imports at its top are the whole list of what it builds on: a reader sees them, and
an import cycle fails the first time either module is imported instead of hiding in a function
until some code path runs it. Function-level imports between library modules used to dodge such
cycles; where one appears, the fix is to move what both modules need into the lower one, or to
hand the lower module the higher one's object (a callable, a registry entry) instead of
importing it (docs/design.md, "Imports between library modules").

What counts: an ``import library...`` / ``from library... import`` statement (or a relative one)
anywhere inside a function or method of a module under library/, except under
``if TYPE_CHECKING:``. Third-party imports inside functions are not covered: heavy or optional
packages (bitsandbytes, diffusers' pipeline classes, FSDP) may still load on first use.

ALLOWED lists the (module, imported module) pairs that still import inside a function, each with
why. A new one fails, naming its file and line; a listed one that no longer exists fails too, so
that it is removed from the list and cannot come back unnoticed.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "library"

_ENTRY = (
    "the command-line entry stays light to import (tests/tiers.py imports it in every pytest "
    "session), and torch and the libraries that log on import load only after main() has "
    "installed the warning filters and the host allocator setting"
)
ALLOWED = {
    ("library/cli.py", "library.config.cli_args"): _ENTRY,
    ("library/cli.py", "library.config.loader"): _ENTRY,
    ("library/cli.py", "library.config.render"): _ENTRY,
    ("library/cli.py", "library.training.trainer"): _ENTRY,
    ("library/cli.py", "library.training.progress"): _ENTRY,
    ("library/models/loader.py", "library.models.vae_file"): "load_components replaces the VAE "
    "with vae_file's reader, and vae_file and checkpoint_parts are built on this module's file "
    "primitives (load_weights, offline, reads_weights): a cycle until those primitives move to "
    "a module of their own",
}
# Third-party libraries that a config check must not load (they come with the training modules).
HEAVY = ("diffusers", "transformers", "peft", "accelerate", "bitsandbytes")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_modules(
    node: ast.Import | ast.ImportFrom, package: str, known: set[str]
) -> list[str]:
    """The library modules ``node`` imports (``package``: the package it is in; ``known``: the
    library's modules, to tell ``from library.models import loader`` from an object import)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "library"]
    if node.level:  # relative to ``package``
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parent, *filter(None, [node.module])])
    elif node.module and node.module.split(".")[0] == "library":
        base = node.module
    else:
        return []
    names = (f"{base}.{alias.name}" for alias in node.names)
    return list(dict.fromkeys(name if name in known else base for name in names))


def library_imports(source: str, package: str, known: set[str]) -> list[tuple[int, str, bool]]:
    """(line, imported library module, inside a function) of each import of a library module
    in ``source`` (a module of ``package``), leaving out those under ``if TYPE_CHECKING:``."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit_one(other, in_function)
            else:
                visit_one(child, in_function)

    def visit_one(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported = _imported_modules(node, package, known)
            found.extend((node.lineno, name, in_function) for name in imported)
            return
        nested = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(node, in_function or nested)

    visit(ast.parse(source), False)
    return found


def _modules() -> dict[str, tuple[Path, str]]:
    """Library module name -> (its file, its package)."""
    modules = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join(parts[:-1])
        modules[package if parts[-1] == "__init__" else ".".join(parts)] = (path, package)
    return modules


def _all_imports() -> dict[str, list[tuple[int, str, bool]]]:
    """Library module name -> its library_imports."""
    modules = _modules()
    return {
        name: library_imports(path.read_text(encoding="utf-8"), package, set(modules))
        for name, (path, package) in modules.items()
    }


def test_library_modules_import_each_other_at_the_top():
    inside = {}
    modules = _modules()
    for name, imports in _all_imports().items():
        file = modules[name][0].relative_to(ROOT).as_posix()
        for line, imported, in_function in imports:
            if in_function:
                inside.setdefault((file, imported), line)
    new = [f"{file}:{line}: imports {imported}" for (file, imported), line in inside.items()
           if (file, imported) not in ALLOWED]  # fmt: skip
    assert not new, (
        "library modules import library modules inside functions; import them at the top of the "
        "module, and if that makes an import cycle, move what both need into the lower module or "
        "pass the higher module's object in (docs/design.md, Imports between library modules):\n"
        + "\n".join(new)
    )
    cleared = sorted(f"{file}: {imported}" for file, imported in set(ALLOWED) - set(inside))
    assert not cleared, (
        f"these no longer import inside a function: remove them from ALLOWED in "
        f"{Path(__file__).name}: {', '.join(cleared)}"
    )


def _top_level_graph() -> dict[str, set[str]]:
    """Library module -> the library modules it imports when it is imported (not inside
    functions, not for type checking). A module also imports its packages, which is no
    cycle when a package's __init__ imports its modules, so those edges are left out."""
    return {
        name: {imported for _, imported, in_function in imports if not in_function} - {name}
        for name, imports in _all_imports().items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state and (found := visit(imported)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_library_modules_import_no_cycle():
    cycle = _cycle(_top_level_graph())
    assert cycle is None, (
        "an import cycle between library modules: " + " -> ".join(cycle) + "; move what they "
        "share into the lower module, or pass the higher module's object in"
    )


def test_function_imports_are_found_and_type_checking_is_not():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import library.errors\n"
        "if TYPE_CHECKING:\n"
        "    from library.config.schema import Config\n"
        "def f():\n"
        "    from library.models import loader\n"
        "    import torch\n"
        "    if TYPE_CHECKING:\n"
        "        from library.data.dataset import TrainData\n"
        "class C:\n"
        "    def m(self):\n"
        "        from .sibling import x\n"
    )
    known = {"library.errors", "library.models", "library.models.loader"}
    assert library_imports(source, "library.saving", known) == [
        (2, "library.errors", False),
        (6, "library.models.loader", True),
        (12, "library.saving.sibling", True),
    ]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _imported_by(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after ``statement``."""
    probe = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


@pytest.mark.subprocess
def test_the_cli_and_the_config_load_light():
    cli = _imported_by("import library.cli")
    assert "torch" not in cli, "importing library.cli imports torch; import it inside main()"
    config = _imported_by("import library.config.loader")
    heavy = sorted(name for name in HEAVY if name in config)
    assert not heavy, f"loading a config imports {', '.join(heavy)} (a training module's import?)"


def imports_of_tests(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import of the test tree (``tests`` or ``tests.*``) in ``source``,
    wherever it is (inside a function or ``if TYPE_CHECKING:`` too), and of each string naming
    a module of it for a later import (``Deferred("tests.kits.x.kit:KIT")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value.split(":")[0]] if _DOTTED_TESTS.fullmatch(node.value) else []
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] == "tests"]
    return sorted(found)


_DOTTED_TESTS = re.compile(r"tests(\.\w+)+(:\w+)?")


def test_the_library_never_imports_the_tests():
    """Test kits and tiny models live in tests/ (tests/kits/): what ships runs without them."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, _ in _modules().values()
        for line, name in imports_of_tests(path.read_text(encoding="utf-8"))
    ]
    assert not found, "library modules import the test tree:\n" + "\n".join(found)


def test_imports_of_tests_are_found_wherever_they_are():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import testsuite\n"
        "if TYPE_CHECKING:\n"
        "    from tests.kits import kit_of\n"
        "def f():\n"
        "    import tests.kits.sd.tiny\n"
        "KIT = Deferred('tests.kits.sd.kit:KIT')\n"
        "DOC = 'see tests/kits/sd/kit.py'\n"
    )
    assert imports_of_tests(source) == [
        (4, "tests.kits"),
        (6, "tests.kits.sd.tiny"),
        (7, "tests.kits.sd.kit"),
    ]
