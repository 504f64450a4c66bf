"""Library modules import each other at the top of the module, never inside a function, and
never in a cycle.

A module's imports at its top are the whole list of what it builds on: a reader sees them, and
an import cycle fails the first time either module is imported instead of hiding in a function
until some code path runs it. Function-level imports between library modules used to dodge such
cycles; where one appears, the fix is to move what both modules need into the lower one, or to
hand the lower module the higher one's object (a callable, a registry entry) instead of
importing it (docs/design.md, "Imports between library modules").

What counts as an import inside a function: an ``import library...`` / ``from library...
import`` statement (or a relative one) anywhere inside a function or method of a module under
library/, except under ``if TYPE_CHECKING:``. Third-party imports inside functions are not
covered: heavy or optional packages (bitsandbytes, diffusers' pipeline classes, FSDP) may still
load on first use.

ALLOWED lists the (module, imported module) pairs that still import inside a function, each with
why. A new one fails, naming its file and line; a listed one that no longer exists fails too, so
that it is removed from the list and cannot come back unnoticed.

What counts as a dependency for cycles: every import of a library module a module makes when it
is imported, those under ``if TYPE_CHECKING:`` included (an annotation that names a type builds
on its module as much as code does), and every ``Deferred("package.module:name")`` of a family
entry (library/models/families/family_entry.py), which imports that module on first use. No
cycle may run through them, with no exception: a Deferred name that closes one fails, printing
the cycle. So the code a family builds on never imports the family registry (which lists the
entries, which name the family's code): what it needs of all families is handed to it by the
modules above the families, or is its own entry's (docs/design.md, Imports between library
modules).
"""

from __future__ import annotations

import ast
import functools
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
}
# Third-party libraries that a config check must not load (they come with the training modules).
HEAVY = ("diffusers", "transformers", "peft", "accelerate", "bitsandbytes")


def _parsed(source: str | ast.AST) -> ast.AST:
    """``source``'s tree (a tree is already one)."""
    return source if isinstance(source, ast.AST) else ast.parse(source)


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


def library_imports(
    source: str | ast.AST, package: str, known: set[str]
) -> list[tuple[int, str, bool, bool]]:
    """(line, imported library module, inside a function, under ``if TYPE_CHECKING:``) of each
    import of a library module in ``source`` (a module of ``package``)."""
    found = []

    def visit(node: ast.AST, in_function: bool, checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.body:
                    visit_one(other, in_function, True)
                for other in child.orelse:
                    visit_one(other, in_function, checking)
            else:
                visit_one(child, in_function, checking)

    def visit_one(node: ast.AST, in_function: bool, checking: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported = _imported_modules(node, package, known)
            found.extend((node.lineno, name, in_function, checking) for name in imported)
            return
        nested = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(node, in_function or nested, checking)

    visit(_parsed(source), False, False)
    return found


def _text(node: ast.expr, constants: dict[str, str]) -> str | None:
    """The value of a string literal or of an f-string of module constants, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for value in node.values:
        if isinstance(value, ast.FormattedValue):
            value = value.value
            if not (isinstance(value, ast.Name) and value.id in constants):
                return None
            parts.append(constants[value.id])
        else:
            parts.append(_text(value, constants) or "")
    return "".join(parts)


DEFERRED_NAME = re.compile(r"library(\.\w+)+:\w+")


def deferred_names(source: str | ast.AST) -> list[tuple[int, str]]:
    """(line, "module:name") of each name of a library object imported on first use in
    ``source``: a string (or an f-string of the module's string constants, such as
    ``_PACKAGE``) of the form ``"library.package.module:name"``, as a ``Deferred`` takes it,
    also where it is handed to one later (folder_loader.FolderPart's classes)."""
    tree = _parsed(source)
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Deferred"
            and isinstance(node.args[0], ast.JoinedStr)
        ):
            assert _text(node.args[0], constants), (
                f"line {node.lineno}: a Deferred whose f-string is not made of module constants"
            )
        text = _text(node, constants) if isinstance(node, (ast.Constant, ast.JoinedStr)) else None
        if text and DEFERRED_NAME.fullmatch(text):
            found.append((node.lineno, node.col_offset, text))
    return [(line, text) for line, _, text in sorted(found)]


# The rule tests read every library module, several of them the same tables: each table is
# computed once per session (the files do not change while the tests run).
@functools.cache
def _modules() -> dict[str, tuple[Path, str]]:
    """Library module name -> (its file, its package)."""
    modules = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join(parts[:-1])
        modules[package if parts[-1] == "__init__" else ".".join(parts)] = (path, package)
    return modules


@functools.cache
def _scans() -> dict[str, tuple[list, list, list]]:
    """Library module name -> its (library_imports, deferred_names, imports_of_tests), each
    module parsed once."""
    modules = _modules()
    known = set(modules)
    scans = {}
    for name, (path, package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scans[name] = (
            library_imports(tree, package, known),
            deferred_names(tree),
            imports_of_tests(tree),
        )
    return scans


def _all_imports() -> dict[str, list[tuple[int, str, bool, bool]]]:
    """Library module name -> its library_imports."""
    return {name: scan[0] for name, scan in _scans().items()}


def test_library_modules_import_each_other_at_the_top():
    inside = {}
    modules = _modules()
    for name, imports in _all_imports().items():
        file = modules[name][0].relative_to(ROOT).as_posix()
        for line, imported, in_function, checking in imports:
            if in_function and not checking:
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


def _deferred() -> dict[str, list[tuple[str, str]]]:
    """Library module name -> ("module:name", the library module it names) of its Deferreds
    that name a library module."""
    modules = _modules()
    found = {}
    for name, scan in _scans().items():
        targets = scan[1]
        found[name] = [
            (target, target.split(":")[0])
            for _, target in targets
            if target.split(":")[0] in modules
        ]
    return found


def _graph(deferred: bool = True) -> dict[str, set[str]]:
    """Library module -> the library modules it builds on: what it imports when it is imported,
    for type checking too (not inside functions: those are ALLOWED's), and what its Deferreds
    name (with ``deferred``). A module also imports its packages, which is no cycle when a
    package's __init__ imports its modules, so those edges are left out."""
    graph = {
        name: {imported for _, imported, in_function, _ in imports if not in_function} - {name}
        for name, imports in _all_imports().items()
    }
    if deferred:
        for name, targets in _deferred().items():
            graph[name] |= {module for _, module in targets} - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph.get(module, ())):
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


def _path(graph: dict[str, set[str]], start: str, end: str) -> list[str] | None:
    """The modules from ``start`` to ``end`` along ``graph`` (a shortest path), or None."""
    before: dict[str, str] = {start: start}
    queue = [start]
    for module in queue:
        if module == end:
            path = [end]
            while path[-1] != start:
                path.append(before[path[-1]])
            return path[::-1]
        for imported in sorted(graph.get(module, ())):
            if imported not in before:
                before[imported] = module
                queue.append(imported)
    return None


def test_library_modules_import_no_cycle():
    cycle = _cycle(_graph(deferred=False))
    assert cycle is None, (
        "an import cycle between library modules (imports for type checking count): "
        + " -> ".join(cycle)
        + "; move what they share into the lower module, pass the higher module's object in, "
        "or name the type by what the lower module knows (a Protocol, a base class)"
    )


def test_deferred_names_close_no_cycle():
    """A Deferred is an import on first use: it may not close a cycle (a cycle through several
    Deferreds is found at each of them)."""
    graph = _graph()
    modules = _modules()
    closing = []
    for name, targets in _deferred().items():
        file = modules[name][0].relative_to(ROOT).as_posix()
        for target, module in targets:
            back = _path(graph, module, name)
            if back:
                closing.append(f"{file}: Deferred({target!r}): {' -> '.join([name, *back])}")
    assert not closing, (
        "a Deferred name closes an import cycle (the module it names builds on the module "
        "naming it); make the named module build on lower ones only: hand it what it needs of "
        "the registry from above, or read it from its own entry:\n" + "\n".join(closing)
    )


def test_imports_and_deferred_names_are_found():
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
    known = {"library.errors", "library.models", "library.models.loader", "library.config.schema"}
    assert library_imports(source, "library.saving", known) == [
        (2, "library.errors", False, False),
        (4, "library.config.schema", False, True),
        (6, "library.models.loader", True, False),
        (9, "library.data.dataset", True, True),
        (12, "library.saving.sibling", True, False),
    ]
    deferred = (
        '_PACKAGE = "library.models.families.x"\n'
        'E = Entry(load=Deferred(f"{_PACKAGE}.load:load_x"), family=Deferred("a.b:C").get)\n'
        'PART = FolderPart("vae", "library.models.vae:Reader")\n'
        '"""library.models.x:y in prose"""\n'
    )
    assert deferred_names(deferred) == [
        (2, "library.models.families.x.load:load_x"),
        (3, "library.models.vae:Reader"),
    ]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _path({"a": {"b", "d"}, "b": {"c"}, "d": {"c"}, "c": set()}, "a", "c") == ["a", "b", "c"]
    assert _path({"a": {"b"}, "b": set()}, "b", "a") is None


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


def imports_of_tests(source: str | ast.AST) -> list[tuple[int, str]]:
    """(line, module) of each import of the test tree (``tests`` or ``tests.*``) in ``source``,
    wherever it is (inside a function or ``if TYPE_CHECKING:`` too), and of each string naming
    a module of it for a later import (``Deferred("tests.kits.x.kit:KIT")``)."""
    found = []
    for node in ast.walk(_parsed(source)):
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
    modules = _modules()
    found = [
        f"{modules[module][0].relative_to(ROOT)}:{line}: {name}"
        for module, scan in _scans().items()
        for line, name in scan[2]
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
