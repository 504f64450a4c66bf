"""Every config key, option and argument the docs name exists (README.md and docs/*.md).

What counts as a claim, and what makes it true:

- ``name = value`` in backquotes, and every ``key = ...`` line of a ```toml block (commented-out
  ones too): a config key. Known keys are the schema's (library/config/schema.py SECTIONS, the
  dataset and subset keys), kohya's known-unsupported keys and aliases (library/config/kohya.py),
  the keys only front ends write (frontend_keys.py) and the network_args names. A toml block's
  ``[prompt]`` tables hold sample-prompt keys (library/sampling/prompts.py), a ``*.optimizer_args``
  table optimizer arguments. The value must read as a TOML value, so arithmetic in backquotes
  (``scale = alpha / r``) is no claim; names with capitals are environment variables.
- ``name=value`` (no spaces) in backquotes, and each ``"name=value"`` item of network_args,
  optimizer_args or lr_scheduler_args: a network_args name (kohya.py's supported, aliased and
  refused ones), an argument of an optimizer difftune builds (the classes' signatures, as
  library/training/optimizers.py checks them), a schedule argument
  (library/config/scheduler_args.py) or a config key.
- ``--name`` anywhere in a command line after ``train_network.py``: an option train_network.py
  takes (library/config/cli_args.py: config keys that are not per-dataset, --config, --dry_run,
  ...); after ``lora_tool.py COMMAND``: an option of that command (its argparse parser); between
  ``accelerate launch`` or ``torchrun`` and the script: the launcher's (their own parsers). A
  backquoted ``--name`` without a command may be any of these or a sample-prompt option (--w,
  --n, ...). Command lines come from backquotes and from shell, text and unlabelled blocks
  (``\\`` continuations joined).
- a bare backquoted snake_case name: most are not config keys (metadata ``ss_*`` names, module
  and tensor names, functions, JSON fields), so a bare name is a claim only when it is a typo's
  distance from a known key (``cache_latent``, ``network_dims``) and not a key itself.

A claim that is not true is reported as ``file:line: what (why; did you mean ...)``. What is not
checked: table names (kohya files may use any), values, and names in prose without backquotes.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from library.config.frontend_keys import FRONTEND_ONLY_KEYS
from library.config.kohya import (
    _NETWORK_ARG_REASONS,
    _OFF_NETWORK_ARGS,
    ALIASES,
    NETWORK_ARG_ALIASES,
    SUPPORTED_NETWORK_ARGS,
    UNSUPPORTED,
)
from library.config.overrides import DEFAULT_KEYS, all_key_names, flat_keys
from library.config.scheduler_args import SCHEDULE_ARGS

ROOT = Path(__file__).resolve().parents[1]

# Names in backquotes that look like claims but are something else. Keep these short: each entry
# says what the name is.
PLACEHOLDERS = {"key", "flag", "name"}  # `--key value`, `"key=value"`, `--flag`, ` --name value`
OTHER_NAMES = {  # bare names a typo away from a config key
    "config_files": "a field of the --dry_run --json plan and of the run summary",
    "text_encoder_2": "diffusers' folder and module of SDXL's second text encoder",
}
OTHER_ARGUMENTS = {  # name=value arguments of other libraries' calls, quoted as code
    "extra": "pydantic's ConfigDict(extra=...)",
    "step_scheduler_with_optimizer": "accelerate's Accelerator(...)",
    "weights_only": "torch.load(...)",
    "nargs": "argparse's add_argument(...)",
    "find_unused_parameters": "torch's DistributedDataParallel(...)",
    "val": "the validation-loss field of the progress bar (val=0.123)",
}
# sd-scripts' LoRA scripts' options, named in docs/lora-tools.md beside the options they map to
# (networks/resize_lora.py, svd_merge_lora.py, merge_lora.py).
SD_SCRIPTS_OPTIONS = {
    "save_to",
    "new_rank",
    "new_conv_rank",
    "models",
    "sd_model",
    "lbws",
    "shuffle",
}


@dataclass(frozen=True)
class Vocabulary:
    """Every name a doc may use, by kind."""

    config: frozenset[str]  # keys a config file may hold
    train_options: frozenset[str]  # train_network.py's --options
    network_args: frozenset[str]
    optimizer_args: frozenset[str]
    scheduler_args: frozenset[str]
    lora_tool: dict[str, frozenset[str]]  # command -> its options
    launchers: dict[str, frozenset[str]]  # "accelerate" / "torchrun" -> launch options
    bench: dict[str, frozenset[str]]  # "bench/x.py" -> its options
    prompt_options: frozenset[str]  # --w, --n, ... of a prompts .txt line
    prompt_keys: frozenset[str]  # keys of a prompts .toml / .json


def _option_names(parser) -> frozenset[str]:
    """The --long options of an argparse parser, without the dashes."""
    return frozenset(
        s[2:].replace("-", "_") for a in parser._actions for s in a.option_strings if s[:2] == "--"
    )


def _optimizer_arguments() -> frozenset[str]:
    """Keyword arguments of every optimizer class optimizer_type names (those importable), as
    library/training/optimizers.py checks them."""
    from library.training.optimizers import SPECS, optimizer_class

    names: set[str] = set()
    for name in SPECS:
        try:
            cls = optimizer_class(name)
        except Exception:  # an optional package missing here: its arguments go unchecked
            continue
        params = inspect.signature(cls.__init__).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return frozenset(names - {"self", "params", "lr"})  # lr comes from learning_rate


_ADD_ARGUMENT = re.compile(r"add_argument\(\s*\"--([\w-]+)\"")


def _bench_options() -> dict[str, frozenset[str]]:
    """The --options of each bench/ script, read from its add_argument calls (running the
    scripts' --help would import torch once per script)."""
    return {
        path.relative_to(ROOT).as_posix(): frozenset(
            m.group(1).replace("-", "_") for m in _ADD_ARGUMENT.finditer(path.read_text("utf-8"))
        )
        for path in sorted((ROOT / "bench").glob("*.py"))
    }


@functools.cache
def vocabulary() -> Vocabulary:
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    from library.config import cli_args
    from library.lora_tools.cli import COMMANDS, build_parser
    from library.sampling import prompts

    network_args = {*SUPPORTED_NETWORK_ARGS, *NETWORK_ARG_ALIASES, *_OFF_NETWORK_ARGS}
    network_args |= set(_NETWORK_ARG_REASONS)  # known kohya arguments refused with a reason
    config = {*all_key_names(), *UNSUPPORTED, *ALIASES, *FRONTEND_ONLY_KEYS}
    train_options = {*flat_keys(), *DEFAULT_KEYS, *UNSUPPORTED, *ALIASES}
    train_options |= {*cli_args._CONFIG_OPTIONS, *cli_args._ACTIONS, "help"}
    subparsers = next(a for a in build_parser()._actions if a.dest == "command").choices
    return Vocabulary(
        config=frozenset(config),
        train_options=frozenset(train_options),
        network_args=frozenset(network_args),
        optimizer_args=_optimizer_arguments(),
        scheduler_args=frozenset(k for args in SCHEDULE_ARGS.values() for k in args),
        lora_tool={c: _option_names(subparsers[c]) for c in COMMANDS},
        launchers={
            "accelerate": _option_names(launch_command_parser()),
            "torchrun": _option_names(get_args_parser()),
        },
        bench=_bench_options(),
        prompt_options=frozenset({*prompts.OPTIONS, *prompts._UNSUPPORTED_OPTIONS}),
        prompt_keys=frozenset(prompts._KEY_TYPES),
    )


# ---------------------------------------------------------------------------------------------
# Reading the docs


@dataclass(frozen=True)
class Claim:
    """A name a doc uses as ``kind``; ``scope`` narrows what it may be (a command, a table)."""

    line: int
    kind: str  # "key", "item", "option", "bare"
    name: str
    scope: str = ""


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*(\w*)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][\w.]*)\s+=\s+(.+)$")  # TOML style: spaces around =
_ITEM = re.compile(r"^\"?([A-Za-z_]\w*)=(.*?)\"?$")  # kohya's "k=v" items, Python's k=v
_TABLE = re.compile(r"^\s*\[\[?\s*([\w.]+)\s*\]\]?")
_TOML_KEY = re.compile(r"^\s*([A-Za-z_]\w*)\s*=")
_COMMENT_KEY = re.compile(r"#.*?\b([a-z][a-z0-9_]*) = ")
_STRING_ITEM = re.compile(r"\"([A-Za-z_]\w*)=")


def _is_toml_value(text: str) -> bool:
    try:
        return list(tomllib.loads(f"v = {text}")) == ["v"]
    except tomllib.TOMLDecodeError:
        return False


def _list_items(name: str, value: str, line: int) -> list[Claim]:
    """The "k=v" items of a network_args / optimizer_args list value."""
    if name not in ("network_args", "optimizer_args", "lr_scheduler_args"):
        return []
    return [Claim(line, "item", m.group(1), name) for m in _STRING_ITEM.finditer(value)]


def _command_claims(text: str, line: int) -> list[Claim]:
    """Options of train_network.py, lora_tool.py and the launchers in a shell command line."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        words = text.split()
    claims: list[Claim] = []
    scope = ""  # whose options the next --name is
    for i, word in enumerate(words):
        if word in ("|", "&&", ";", "||") or word.startswith(">"):
            scope = ""
        elif word.endswith("train_network.py"):
            scope = "train"
        elif word.endswith("lora_tool.py"):
            following = words[i + 1] if i + 1 < len(words) else ""
            scope = f"lora_tool {following}" if following in vocabulary().lora_tool else ""
        elif word == "launch" and i and words[i - 1] == "accelerate":
            scope = "accelerate"
        elif word == "torchrun" or word == "torch.distributed.run":
            scope = "torchrun"
        elif word in vocabulary().bench:
            scope = word
        elif word.startswith("--") and len(word) > 2 and scope:
            # a command inside $( ... ) or ( ... ) ends with the closing parenthesis
            name, _, value = word[2:].rstrip(")").partition("=")
            claims.append(Claim(line, "option", name.replace("-", "_"), scope))
            if scope == "train" and name in ("network_args", "optimizer_args"):
                values = [value] if value else _values_after(words, i)
                claims += [Claim(line, "item", v.split("=")[0], name) for v in values if "=" in v]
    return claims


def _values_after(words: list[str], i: int) -> list[str]:
    values = []
    for word in words[i + 1 :]:
        if word.startswith("--") or word in ("|", "&&", ";"):
            break
        values.append(word)
    return values


def _span_claims(span: str, line: int) -> list[Claim]:
    span = span.strip()
    if re.search(r"(train_network|lora_tool)\.py|accelerate launch|torchrun|bench/\w+\.py", span):
        return _command_claims(span, line)
    if span.startswith("--") and len(span) > 2:
        name = re.split(r"[ =]", span[2:], maxsplit=1)[0]
        return [Claim(line, "option", name.replace("-", "_"))]
    assignment = _ASSIGNMENT.match(span)
    if assignment:
        name, value = assignment.groups()
        if name != name.lower() or not _is_toml_value(value):
            return []  # an environment variable, or arithmetic
        return [Claim(line, "key", name), *_list_items(name, value, line)]
    item = _ITEM.match(span)
    if item and " " not in span:
        return (
            [] if item.group(1) != item.group(1).lower() else [Claim(line, "item", item.group(1))]
        )
    if _SNAKE.fullmatch(span):
        return [Claim(line, "bare", span)]
    return []


def _toml_claims(lines: list[tuple[int, str]]) -> list[Claim]:
    claims: list[Claim] = []
    table, open_list = "", ""
    for number, text in lines:
        header = _TABLE.match(text)
        if header:
            table = header.group(1)
            continue
        scope = "prompt" if table.split(".")[0] == "prompt" else ""
        if table.endswith("optimizer_args"):
            scope = "optimizer_args"
        key = _TOML_KEY.match(text)
        code = text.split("#")[0]
        if key:
            name = key.group(1)
            claims.append(
                Claim(number, "item" if scope == "optimizer_args" else "key", name, scope)
            )
            open_list = name if "[" in code and "]" not in code else ""
            claims += _list_items(name, code, number)
        elif open_list:
            claims += _list_items(open_list, code, number)
            if "]" in code:
                open_list = ""
        for commented in _COMMENT_KEY.finditer(text):
            claims.append(Claim(number, "key", commented.group(1), scope))
    return claims


def doc_claims(text: str) -> list[Claim]:
    """Every claim of one Markdown document."""
    claims: list[Claim] = []
    fence, language, block = None, "", []
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence, language, block = match.group(1), match.group(2), []
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                claims += _block_claims(language, block)
                fence = None
            else:
                block.append((number, line))
            continue
        for span in _CODE_SPAN.finditer(line):
            claims += _span_claims(span.group(2), number)
    return claims


def _block_claims(language: str, block: list[tuple[int, str]]) -> list[Claim]:
    if language == "toml":
        return _toml_claims(block)
    if language in ("json", "python", "yaml"):
        return []  # shell, text and unlabelled blocks: their command lines
    claims, start, joined = [], 0, ""
    for number, text in block:
        start = start or number
        if text.rstrip().endswith("\\"):
            joined += text.rstrip()[:-1] + " "
            continue
        claims += _command_claims(joined + text, start)
        start, joined = 0, ""
    return claims


# ---------------------------------------------------------------------------------------------
# Judging the claims


def _typo_distance(a: str, b: str) -> int:
    """Edit distance counting a swap of two neighbours as one edit."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def _near_key(name: str, keys: frozenset[str]) -> str | None:
    """A known key within a typo of ``name`` (one edit for short names, two from 8 letters)."""
    limit = 1 if len(name) < 8 else 2
    close = [
        k for k in keys if abs(len(k) - len(name)) <= limit and _typo_distance(name, k) <= limit
    ]
    return min(close, key=lambda k: (_typo_distance(name, k), k)) if close else None


def did_you_mean(name: str, known, prefix: str = "") -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"did you mean `{prefix}{close[0]}`?" if close else "no similar name"


def problem(claim: Claim) -> str | None:
    """Why ``claim`` is not true, or None."""
    v, name = vocabulary(), claim.name
    if name in PLACEHOLDERS:
        return None
    if claim.kind == "bare":
        known = v.config | v.prompt_keys
        if name.startswith(("ss_", "sshs_")) or name in known or name in OTHER_NAMES:
            return None  # kohya's metadata names, or a key (of a config or a prompts file)
        near = _near_key(name, v.config)
        return f"`{name}` is not a config key (did you mean `{near}`?)" if near else None
    if claim.kind == "key":
        known = v.prompt_keys if claim.scope == "prompt" else v.config
        if name in known or name.startswith("ss_"):
            return None
        what = "sample-prompt key" if claim.scope == "prompt" else "config key"
        return f"`{name}` is not a {what} ({did_you_mean(name, known)})"
    if claim.kind == "item":
        if not claim.scope and name in OTHER_ARGUMENTS:
            return None
        known = {
            "network_args": v.network_args,
            "optimizer_args": v.optimizer_args,
            "lr_scheduler_args": v.scheduler_args,
        }.get(claim.scope, v.network_args | v.optimizer_args | v.scheduler_args | v.config)
        if name in known:
            return None
        what = f"{claim.scope} argument" if claim.scope else "argument"
        return f"`{name}=` is not a known {what} ({did_you_mean(name, known)})"
    # an option
    if claim.scope == "train":
        known, whose = v.train_options, "train_network.py"
    elif claim.scope.startswith("lora_tool "):
        known, whose = v.lora_tool[claim.scope.split()[1]], f"`{claim.scope.replace(' ', '.py ')}`"
    elif claim.scope in v.launchers:
        known, whose = v.launchers[claim.scope], f"{claim.scope}"
    elif claim.scope in v.bench:
        known, whose = v.bench[claim.scope], f"`{claim.scope}`"
    else:
        known = v.train_options | v.prompt_options | SD_SCRIPTS_OPTIONS
        known = known.union(*v.lora_tool.values(), *v.launchers.values(), *v.bench.values())
        whose = "train_network.py, lora_tool.py, a launcher, a bench script or a prompt line"
    if name in known:
        return None
    return f"`--{name}` is not an option of {whose} ({did_you_mean(name, known, '--')})"


def doc_problems(path: Path, shown: str | None = None) -> list[str]:
    shown = shown or path.relative_to(ROOT).as_posix()
    found = []
    for claim in doc_claims(path.read_text(encoding="utf-8")):
        why = problem(claim)
        if why:
            found.append(f"{shown}:{claim.line}: {why}")
    return found


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: p.name)
def test_every_key_and_option_a_doc_names_exists(doc):
    assert doc_problems(doc) == []


def test_the_docs_make_claims_of_every_kind():
    """The reader still finds what it checks (a changed Markdown style would empty it)."""
    claims = [c for doc in _docs() for c in doc_claims(doc.read_text(encoding="utf-8"))]
    kinds = {(c.kind, c.scope.split()[0] if c.scope else "") for c in claims}
    for kind in [("key", ""), ("item", "network_args"), ("item", "optimizer_args"), ("bare", "")]:
        assert kind in kinds
    for scope in ["train", "lora_tool", "accelerate", "torchrun", "bench/train_speed.py", ""]:
        assert ("option", scope) in kinds, scope
    assert len(claims) > 500


_BROKEN = """\
Set `cache_latent = true` and `--learnig_rate 1e-4`; `network_dims` is the rank.
Kohya's `"algorithm=lokr"` and `weightdecay=0.01`.
`lora_tool.py resize --input a.safetensors --new_rank 8 --output b.safetensors`

```toml
[[datasets]]
resolution = 512
batchsize = 2    # or train_batch_sizes = 2
network_args = [
  "algo=lokr", "factr=8",
]
[optimizer.optimizer_args]
weight_decy = 0.01

[prompt]
widht = 768
```

```bash
accelerate launch --num_proceses 2 train_network.py --config x.toml \\
    --max_train_step 10 --optimizer_args eps=1e-3 betass=0.9,0.99
torchrun --nproc_per_nod 2 train_network.py --config x.toml
python lora_tool.py merge --model m --loras a.safetensors --ratio 0.5 --output o.safetensors
python bench/train_speed.py --cases sd15-lora --step 12
```
"""

_FINE = """\
`ss_network_dim` and `sshs_model_hash` are metadata; `to_k`, `conv_in`, `lora_down` are module
and tensor names; `scale = alpha / r` is arithmetic; `WANDB_MODE=offline` is an environment
variable; `"key=value"` is a placeholder; `--w 768` is a prompt option; `--multi_gpu` is
accelerate's; `--save_to` is sd-scripts'; `cache_latents`, `network_dim = 16`, `--learning_rate`,
`"algo=lokr"`, `relative_step=True` and `lora_tool.py resize --rank 8` are ours;
`find_unused_parameters=False` is torch's.
"""


def test_the_checker_finds_misspelled_and_stale_names(tmp_path):
    doc = tmp_path / "broken.md"
    doc.write_text(_BROKEN, encoding="utf-8")
    found = doc_problems(doc, "broken.md")
    expected = {
        1: ["`cache_latent` is not a config key", "`--learnig_rate`", "`network_dims`"],
        2: ["`algorithm=`", "`weightdecay=`"],
        3: ["`--new_rank` is not an option of `lora_tool.py resize`"],
        8: ["`batchsize`", "`train_batch_sizes`"],
        10: ["`factr=` is not a known network_args argument"],
        13: ["`weight_decy=` is not a known optimizer_args argument"],
        16: ["`widht` is not a sample-prompt key"],
        20: [
            "`--num_proceses` is not an option of accelerate",
            "`--max_train_step` is not an option of train_network.py",
            "`betass=`",
        ],
        22: ["`--nproc_per_nod` is not an option of torchrun"],
        23: ["`--ratio` is not an option of `lora_tool.py merge`"],
        24: ["`--step` is not an option of `bench/train_speed.py`"],
    }
    for line, fragments in expected.items():
        mine = [f for f in found if f.startswith(f"broken.md:{line}: ")]
        for fragment in fragments:
            assert any(fragment in f for f in mine), (line, fragment, found)
    assert len(found) == sum(map(len, expected.values())), "\n".join(found)
    assert "did you mean `cache_latents`" in found[0]


def test_the_checker_accepts_names_that_are_not_keys(tmp_path):
    doc = tmp_path / "fine.md"
    doc.write_text(_FINE, encoding="utf-8")
    assert doc_problems(doc, "fine.md") == []


def test_a_copy_of_a_real_doc_with_one_typo_fails(tmp_path):
    original = (ROOT / "docs" / "training-options.md").read_text(encoding="utf-8")
    broken = original.replace("network_dim = 16", "network_dimm = 16", 1)
    assert broken != original
    before, after = tmp_path / "before.md", tmp_path / "after.md"
    before.write_text(original, encoding="utf-8")
    after.write_text(broken, encoding="utf-8")
    new = set(doc_problems(after, "copy")) - set(doc_problems(before, "copy"))
    assert len(new) == 1 and "`network_dimm` is not a config key" in new.pop()
