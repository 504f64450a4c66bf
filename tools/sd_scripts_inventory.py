"""Inventory every command-line option of kohya-ss sd-scripts' training scripts.

python tools/sd_scripts_inventory.py --repo ../sd-scripts           # a checkout
python tools/sd_scripts_inventory.py --git-dir REPO.git --commit 48d368fa
    (add --check to compare with the committed facts module instead of writing it)

Method: an AST walk, nothing of sd-scripts is imported or run. For each training script the
walk starts at its ``setup_parser`` function and follows what that function really calls:
``parser.add_argument(...)`` records an option; a call that hands ``parser`` to a function
(``train_util.add_training_arguments(parser, True)``, ``add_logging_arguments(parser)``) is
followed into that function, found through the module's imports, with its arguments bound to
its parameters so that ``if support_dreambooth:`` blocks are taken or skipped as at run time;
``parser = train_network.setup_parser()`` continues from that script's parser. A statement the
walk does not understand that mentions ``parser`` stops the tool with an error, so no option is
missed silently.

The output is tests/config/kohya_arguments.py: for every option (argparse's ``dest``) the
values that mean "off" or "default" there and the scripts that define it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACTS_PATH = ROOT / "tests" / "config" / "kohya_arguments.py"
PINNED_COMMIT = "48d368fa557731ad0488c07304dfeba8c07910eb"

# Every script that trains something, as of the pinned commit (sd-scripts' root folder).
SCRIPTS = (
    "train_network",
    "sdxl_train_network",
    "flux_train_network",
    "sd3_train_network",
    "lumina_train_network",
    "anima_train_network",
    "hunyuan_image_train_network",
    "flux_train",
    "sd3_train",
    "sdxl_train",
    "fine_tune",
    "train_db",
    "lumina_train",
    "anima_train",
    "train_textual_inversion",
    "train_textual_inversion_XTI",
    "sdxl_train_textual_inversion",
    "train_control_net",
    "train_controlnet",
    "sdxl_train_control_net",
    "sdxl_train_control_net_lllite",
    "sdxl_train_control_net_lllite_old",
    "flux_train_control_net",
)


class InventoryError(Exception):
    """The walk met code it cannot follow."""


class Source:
    """sd-scripts' files: a checkout folder, or a git repository at one commit."""

    def __init__(self, repo: Path | None = None, git_dir: Path | None = None, commit: str = ""):
        self.repo, self.git_dir, self.commit = repo, git_dir, commit

    def read(self, path: str) -> str:
        if self.repo is not None:
            return (self.repo / path).read_text(encoding="utf-8")
        spec = f"{self.commit}:{path}"
        done = subprocess.run(
            ["git", "--git-dir", str(self.git_dir), "show", spec], capture_output=True, check=False
        )
        if done.returncode:
            raise InventoryError(f"cannot read {spec}: {done.stderr.decode().strip()}")
        return done.stdout.decode("utf-8")

    def full_commit(self) -> str:
        if self.repo is not None:
            args = ["git", "-C", str(self.repo), "rev-parse", "HEAD"]
        else:
            args = ["git", "--git-dir", str(self.git_dir), "rev-parse", self.commit]
        return subprocess.run(args, capture_output=True, check=True, text=True).stdout.strip()


@dataclass
class Option:
    """One argparse option as a script defines it."""

    dest: str
    default: object  # argparse's default (store_true: False)
    nargs: str | None = None


@dataclass
class Module:
    """A parsed file: its functions, its imported names and its constant assignments."""

    path: str
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # name -> (mod, attr)
    constants: dict[str, object] = field(default_factory=dict)


def _module_path(dotted: str) -> str:
    return dotted.replace(".", "/") + ".py"


class Walker:
    """Follows setup_parser calls through sd-scripts' modules (see the module docstring)."""

    def __init__(self, source: Source):
        self.source = source
        self.modules: dict[str, Module] = {}

    def module(self, path: str) -> Module:
        if path not in self.modules:
            tree = ast.parse(self.source.read(path), filename=path)
            module = Module(path)
            for node in tree.body:
                self._index(module, node)
            self.modules[path] = module
        return self.modules[path]

    @staticmethod
    def _index(module: Module, node: ast.stmt) -> None:
        if isinstance(node, ast.FunctionDef):
            module.functions[node.name] = node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module.imports[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                module.imports[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                with contextlib.suppress(ValueError):  # only literals are constants here
                    module.constants[target.id] = ast.literal_eval(node.value)

    def function(self, module: Module, call: ast.expr) -> tuple[Module, ast.FunctionDef]:
        """The function a call's ``func`` names: local, imported, or ``module.attr``."""
        if isinstance(call, ast.Name):
            if call.id in module.functions:
                return module, module.functions[call.id]
            if call.id in module.imports:
                dotted, attr = module.imports[call.id]
                return self._defined(dotted, attr or call.id)
        if isinstance(call, ast.Attribute) and isinstance(call.value, ast.Name):
            owner = module.imports.get(call.value.id)
            if owner is not None:
                dotted, attr = owner
                return self._defined(f"{dotted}.{attr}" if attr else dotted, call.attr)
        raise InventoryError(f"{module.path}: cannot follow the call {ast.unparse(call)}")

    def _defined(self, dotted: str, name: str) -> tuple[Module, ast.FunctionDef]:
        module = self.module(_module_path(dotted))
        if name in module.functions:
            return module, module.functions[name]
        if name in module.imports:  # re-exported: ``from train_control_net import setup_parser``
            origin, attr = module.imports[name]
            return self._defined(origin, attr or name)
        raise InventoryError(f"{module.path} has no function {name}")

    def script(self, name: str) -> dict[str, Option]:
        """Every option of ``name``.py's parser, by dest."""
        module = self.module(f"{name}.py")
        owner, setup = self._defined(name, "setup_parser")
        options: dict[str, Option] = {}
        self._body(owner, setup, {}, options)
        if not options:
            raise InventoryError(f"{module.path}: setup_parser defines no option")
        return options

    def _body(self, module: Module, func: ast.FunctionDef, env: dict, options: dict) -> None:
        self._block(module, func.body, env, options)

    def _block(self, module: Module, block: list[ast.stmt], env: dict, options: dict) -> bool:
        """Walk statements until a ``return``; True when one was met (the function ends)."""
        for node in block:
            if isinstance(node, ast.Return):
                return True
            if isinstance(node, ast.If):
                branch = node.body if self._truth(node.test, env, module) else node.orelse
                if self._block(module, branch, env, options):
                    return True
            else:
                self._statement(module, node, env, options)
        return False

    def _statement(self, module: Module, node: ast.stmt, env: dict, options: dict) -> None:
        if isinstance(node, ast.Assign) and _is_parser_name(node.targets):
            self._parser_value(module, node.value, env, options)
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            self._call(module, node.value, env, options)
            return
        if isinstance(node, (ast.FunctionDef, ast.Pass)) or _is_docstring(node):
            return  # local helpers (argparse type functions)
        if "parser" in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
            raise InventoryError(f"{module.path}:{node.lineno}: cannot follow {ast.unparse(node)}")

    def _parser_value(self, module: Module, value: ast.expr, env: dict, options: dict) -> None:
        """``parser = argparse.ArgumentParser()`` or ``parser = other.setup_parser()``."""
        if not isinstance(value, ast.Call):
            raise InventoryError(f"{module.path}: parser = {ast.unparse(value)}")
        if ast.unparse(value.func) == "argparse.ArgumentParser":
            return
        owner, func = self.function(module, value.func)
        self._body(owner, func, {}, options)

    def _call(self, module: Module, call: ast.Call, env: dict, options: dict) -> None:
        func = call.func
        if isinstance(func, ast.Attribute) and ast.unparse(func.value) == "parser":
            if func.attr != "add_argument":
                raise InventoryError(f"{module.path}:{call.lineno}: parser.{func.attr}")
            option = self._option(module, call, env)
            if option.dest in options:
                raise InventoryError(f"{module.path}:{call.lineno}: --{option.dest} added twice")
            options[option.dest] = option
            return
        uses_parser = any(isinstance(a, ast.Name) and a.id == "parser" for a in call.args)
        if not uses_parser:
            return  # e.g. a logger call
        owner, target = self.function(module, func)
        self._body(owner, target, self._bind(module, target, call, env), options)

    def _bind(self, module: Module, func: ast.FunctionDef, call: ast.Call, env: dict) -> dict:
        """The called function's parameters: its defaults, then the call's arguments."""
        params = [a.arg for a in func.args.args]
        bound: dict[str, object] = {}
        defaults = func.args.defaults
        for name, default in zip(params[len(params) - len(defaults) :], defaults, strict=True):
            bound[name] = ast.literal_eval(default)
        for name, arg in zip(params, call.args, strict=False):
            bound[name] = "parser" if name == "parser" else self._value(arg, env, module)
        for keyword in call.keywords:
            bound[keyword.arg] = self._value(keyword.value, env, module)
        return bound

    def _value(self, node: ast.expr, env: dict, module: Module) -> object:
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.Name) and node.id in module.constants:
            return module.constants[node.id]
        if isinstance(node, ast.Name) and node.id == "parser":
            return "parser"
        try:
            return ast.literal_eval(node)
        except ValueError:
            raise InventoryError(f"{module.path}: cannot evaluate {ast.unparse(node)}") from None

    def _truth(self, test: ast.expr, env: dict, module: Module) -> bool:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return not self._truth(test.operand, env, module)
        if isinstance(test, ast.BoolOp):
            values = [self._truth(v, env, module) for v in test.values]
            return all(values) if isinstance(test.op, ast.And) else any(values)
        return bool(self._value(test, env, module))

    def _option(self, module: Module, call: ast.Call, env: dict) -> Option:
        names = [self._value(a, env, module) for a in call.args]
        keywords = {k.arg: k.value for k in call.keywords}
        longs = [n for n in names if isinstance(n, str) and n.startswith("--")]
        if "dest" in keywords:
            dest = self._value(keywords["dest"], env, module)
        elif longs:
            dest = longs[0][2:].replace("-", "_")
        else:
            raise InventoryError(f"{module.path}:{call.lineno}: option without a long name")
        action = self._value(keywords["action"], env, module) if "action" in keywords else None
        if action == "store_true":
            default = False
        elif action is None:
            default = self._value(keywords["default"], env, module) if "default" in keywords else None
        else:
            raise InventoryError(f"{module.path}:{call.lineno}: action {action!r}")
        if action == "store_true" and "default" in keywords:
            default = self._value(keywords["default"], env, module)
        nargs = self._value(keywords["nargs"], env, module) if "nargs" in keywords else None
        return Option(dest, default, nargs)


def _is_parser_name(targets: list[ast.expr]) -> bool:
    return len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == "parser"


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def off_values(option: Option) -> tuple:
    """What a kohya file writes for the option left at its default: argparse's None is "" (the
    GUIs' empty field), and an unset list option may also be written []."""
    if option.default is None:
        return ("", []) if option.nargs in ("*", "+") else ("",)
    return (option.default,)


def inventory(source: Source) -> dict[str, dict[str, Option]]:
    """script name -> dest -> Option, for every script of SCRIPTS."""
    walker = Walker(source)
    return {name: walker.script(name) for name in SCRIPTS}


def _merged(found: dict[str, dict[str, Option]]) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(key -> its off values over all scripts, key -> the scripts that define it)."""
    offs: dict[str, list] = {}
    scripts: dict[str, list[str]] = {}
    for name, options in found.items():
        for dest, option in options.items():
            values = offs.setdefault(dest, [])
            for value in off_values(option):
                if not any(type(v) is type(value) and v == value for v in values):
                    values.append(value)
            scripts.setdefault(dest, []).append(name)
    return (
        {k: tuple(v) for k, v in sorted(offs.items())},
        {k: tuple(v) for k, v in sorted(scripts.items())},
    )


_HEADER = '''\
"""Every option of kohya-ss sd-scripts' training scripts, as facts for tests of what difftune
must load: the values that mean "off" or "default" there (argparse's defaults: false for
switches, "" for options left unset, [] too for unset lists, the default value otherwise; all of
them when scripts differ) and the scripts that define each option.

Generated by tools/sd_scripts_inventory.py (an AST walk of each script's setup_parser) from
kohya-ss/sd-scripts at commit {commit}; do not edit by hand.
"""

SD_SCRIPTS_COMMIT = "{commit}"

SCRIPTS: tuple[str, ...] = (
{scripts})
'''


def _line(key: str, value: str) -> str:
    line = f"    {key!r}: {value},"
    return line.replace("'", '"') if '"' not in line else line


def _differing(found: dict[str, dict[str, Option]]) -> dict[str, dict[object, tuple]]:
    """key -> its argparse default -> the scripts with that default, for keys whose default
    differs between scripts (None, an unset option, is shown as "")."""
    by_key: dict[str, dict[object, list[str]]] = {}
    for name, options in found.items():
        for dest, option in options.items():
            value = off_values(option)[0]
            by_key.setdefault(dest, {}).setdefault(value, []).append(name)
    return {
        key: {value: tuple(where) for value, where in defaults.items()}
        for key, defaults in sorted(by_key.items())
        if len(defaults) > 1
    }


def _scripts_value(name: str, where: tuple[str, ...], indent: int = 4) -> str:
    """``name: SCRIPTS,`` when every script is in ``where``, else ``name: (...),`` packed into
    lines of at most 100 characters; ``name`` is the dict key as written."""
    pad = " " * indent
    if set(where) == set(SCRIPTS):
        return f"{pad}{name}: SCRIPTS,"
    text = f"{pad}{name}: {where!r},".replace("'", '"')
    if len(text) <= 100:
        return text
    lines, current = [], pad + "   "
    for script in where:
        if len(current) + len(script) + 4 > 100:
            lines.append(current)
            current = pad + "   "
        current += f' "{script}",'
    return f"{pad}{name}: (\n" + "\n".join([*lines, current]) + f"\n{pad}),"


def render_facts(found: dict[str, dict[str, Option]], commit: str) -> str:
    """The text of the generated facts module."""
    offs, scripts = _merged(found)
    names = "".join(f'    "{name}",\n' for name in found)
    lines = [_HEADER.format(commit=commit, scripts=names)]
    lines.append("KOHYA_OFF_VALUES: dict[str, tuple] = {")
    lines += [_line(key, repr(values)) for key, values in offs.items()]
    lines += ["}", "", "# Options whose default differs between scripts: default -> the scripts."]
    lines.append("KOHYA_SCRIPT_DEFAULTS: dict[str, dict[object, tuple[str, ...]]] = {")
    for key, defaults in _differing(found).items():
        lines.append(f'    "{key}": {{')
        for value, where in defaults.items():
            lines.append(_scripts_value(repr(value).replace("'", '"'), where, indent=8))
        lines.append("    },")
    lines += ["}", "", "# SCRIPTS: the option is defined by every training script."]
    lines.append("KOHYA_SCRIPTS: dict[str, tuple[str, ...]] = {")
    lines += [_scripts_value(f'"{key}"', where) for key, where in scripts.items()]
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) the facts module from an sd-scripts source."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", type=Path, help="an sd-scripts checkout (its HEAD is used)")
    where.add_argument("--git-dir", type=Path, help="an sd-scripts git repository (bare or not)")
    parser.add_argument("--commit", default=PINNED_COMMIT, help="with --git-dir: the commit")
    parser.add_argument("--output", type=Path, default=FACTS_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs")
    args = parser.parse_args(argv)
    source = Source(repo=args.repo, git_dir=args.git_dir, commit=args.commit)
    try:
        text = render_facts(inventory(source), source.full_commit())
    except InventoryError as exc:
        print(f"sd_scripts_inventory: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} differs from the inventory of {args.commit}")
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
