"""tools/sd_scripts_inventory.py on a small sd-scripts-shaped tree written here (no sd-scripts
needed): it follows setup_parser through imports, helper calls and their flags as argparse
would, and stops on code it cannot follow instead of missing options."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

UTIL = '''
import argparse

DEFAULT_NAME = "last"


def add_common_arguments(parser, support_reg: bool, support_drop=True):
    parser.add_argument("--output_name", type=str, default=DEFAULT_NAME)
    parser.add_argument("--cache_latents", action="store_true")
    parser.add_argument("--optimizer_args", type=str, default=None, nargs="*")
    parser.add_argument("--max-steps", dest="max_train_steps", type=int, default=1600)
    if support_reg:
        parser.add_argument("--reg_data_dir", type=str, default=None)
    if not support_drop:
        return
    parser.add_argument("--caption_dropout_rate", type=float, default=0.0)
'''

LOGS = '''
def add_logging_arguments(parser):
    parser.add_argument("--console_log_simple", action="store_true")
'''

TRAIN_A = '''
import argparse
import kohyalib.util as util
from kohyalib.logs import add_logging_arguments


def setup_parser():
    parser = argparse.ArgumentParser()
    add_logging_arguments(parser)
    util.add_common_arguments(parser, True)
    parser.add_argument("--network_dim", type=int, default=None)
    return parser
'''

TRAIN_B = '''
import train_a
from kohyalib import util


def setup_parser():
    parser = train_a.setup_parser()
    parser.add_argument("--blocks_to_swap", type=int, default=None)
    return parser
'''

TRAIN_C = '''
import argparse
from kohyalib import util


def setup_parser():
    parser = argparse.ArgumentParser()
    util.add_common_arguments(parser, support_reg=False, support_drop=False)
    parser.add_argument("--save_model_as", type=str, default="pt")
    return parser
'''

# re-exports another script's setup_parser, as train_controlnet.py does
TRAIN_D = "from train_c import setup_parser\n"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "sd_scripts_inventory", ROOT / "tools" / "sd_scripts_inventory.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool():
    return _tool()


def _tree(root: Path, scripts: dict[str, str]) -> Path:
    # sd-scripts' helpers live in library/; here in kohyalib/, apart from difftune's library
    files = {"kohyalib/__init__.py": "", "kohyalib/util.py": UTIL, "kohyalib/logs.py": LOGS}
    files.update({f"{name}.py": text for name, text in scripts.items()})
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def _found(tool, root: Path, scripts: tuple[str, ...]):
    walker = tool.Walker(tool.Source(repo=root))
    return {name: walker.script(name) for name in scripts}


def _argparse_defaults(root: Path, script: str) -> dict:
    """What argparse itself makes of the script's parser: the independent answer."""
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(script)
        return vars(module.setup_parser().parse_args([]))
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] in ("kohyalib", *SCRIPTS)]:
            sys.modules.pop(name)


SCRIPTS = {"train_a": TRAIN_A, "train_b": TRAIN_B, "train_c": TRAIN_C, "train_d": TRAIN_D}


@pytest.fixture
def tree(tmp_path):
    return _tree(tmp_path / "sd-scripts", SCRIPTS)


@pytest.mark.parametrize("script", ["train_a", "train_b", "train_c", "train_d"])
def test_options_and_defaults_are_what_argparse_builds(tool, tree, script):
    options = _found(tool, tree, (script,))[script]
    expected = _argparse_defaults(tree, script)
    assert {k: o.default for k, o in options.items()} == expected


def test_off_values_and_scripts_of_each_key(tool, tree):
    found = _found(tool, tree, ("train_a", "train_b", "train_c"))
    namespace: dict = {}
    exec(tool.render_facts(found, "0" * 40), namespace)  # the generated module is Python
    offs, scripts = namespace["KOHYA_OFF_VALUES"], namespace["KOHYA_SCRIPTS"]
    assert offs["optimizer_args"] == ("", [])  # an unset list may be written [] too
    assert offs["cache_latents"] == (False,)
    assert offs["output_name"] == ("last",)  # a module constant as default
    assert offs["save_model_as"] == ("pt",)
    assert scripts["reg_data_dir"] == ("train_a", "train_b")  # not train_c: support_reg=False
    assert scripts["blocks_to_swap"] == ("train_b",)
    assert scripts["caption_dropout_rate"] == ("train_a", "train_b")  # train_c returns first


def test_code_it_cannot_follow_stops_the_tool(tool, tmp_path):
    looped = TRAIN_A.replace(
        "    return parser",
        '    for name in ("a", "b"):\n        parser.add_argument(f"--{name}")\n    return parser',
    )
    root = _tree(tmp_path, {"train_a": looped})
    with pytest.raises(tool.InventoryError, match="cannot follow"):
        _found(tool, root, ("train_a",))


def test_writes_and_checks_the_facts_of_a_git_commit(tool, tree, tmp_path, monkeypatch):
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run([*git, *args], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    commit = head.stdout.strip()
    monkeypatch.setattr(tool, "SCRIPTS", ("train_a", "train_b"))
    out = tmp_path / "facts.py"
    where = ["--git-dir", str(tree / ".git"), "--commit", commit, "--output", str(out)]
    assert tool.main(where) == 0
    assert f'SD_SCRIPTS_COMMIT = "{commit}"' in out.read_text(encoding="utf-8")
    assert tool.main([*where, "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace("1600", "1601"), encoding="utf-8")
    assert tool.main([*where, "--check"]) == 1
