"""Command-line parsing: --config (any number), --print_config, --dry_run, --json and
``--key value`` overrides.

Hand-written rather than argparse because the override keys come from the schema, their value
forms depend on the field type (bare bool flags, multi-value k=v lists), and every mistake must
be a ConfigError with the nearest valid option instead of argparse's SystemExit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from library.config.kohya import ALIASES
from library.config.overrides import (
    RawValue,
    flat_key_problem,
    is_bool_key,
    is_list_key,
    key_kind,
)
from library.config.suggest import COMMAND_LINE, Origin
from library.errors import ConfigError

OVERRIDE_HELP = """\
Every config key can be set on the command line; the command line wins over the config files.
  --key value  or  --key=value     e.g. --learning_rate 1e-4  --output_name my_lora
  --flag  (same as --flag true)    for true/false keys, e.g. --gradient_checkpointing
  --flag false                     turn a true/false key off
  --key a=1 b=2                    several "k=v" items for network_args and optimizer_args
  --key ""                         unset a key a file sets (kohya's empty value)
Values are read as TOML (1e-4, true, [768, 512]); text keys keep the text as written, and
anything that is not valid TOML stays text (--resolution 768,512).
Dataset keys (--resolution, --shuffle_caption, --flip_aug, ...) given here apply to every
dataset, replacing what its tables say (with a warning for each value replaced; written flat in a
file, they are defaults the tables override, as in kohya); per-folder keys (image_dir,
num_repeats, ...) live in the file, and train_batch_size stands for batch_size. --dry_run also
shows buckets and caches.
All keys, types and defaults: docs/config.md; data options explained: docs/data.md"""

USAGE = f"""\
usage: train_network.py --config FILE.toml [--config MORE.toml ...] [--print_config]
                        [--dry_run [--json]] [--ignore_unknown_keys] [--key value ...]

  --config FILE, --config_file FILE
                  a difftune (sectioned) or kohya (flat args) TOML config. Give several to
                  layer presets: a later file wins over an earlier one key by key, and the
                  command line wins over all files. A file (or option) that gives the images
                  ([[datasets]], train_data_dir or dataset_config) replaces the earlier
                  files' [[datasets]], [general], train_data_dir, reg_data_dir, in_json and
                  dataset_config as a whole; dataset keys written flat layer key by key.
  --print_config  print the resolved config as TOML, each key marked with the file, the
                  command line or the default it came from
  --dry_run       check the config, data and model, print the plan (images, buckets, steps, saves,
                  peak memory), then stop; the model is built at its shapes, no weights are read
  --json          with --dry_run: print the plan as one JSON document on stdout (schema: see
                  "Dry-run JSON" in docs/batch-runs.md); warnings stay on stderr. A refused
                  run prints a JSON document too, with the error and every problem.
  --ignore_unknown_keys
                  load config files that hold keys no tool defines (a front end's leftovers)
                  without them, listing them in one warning (a key a letter or two off a real
                  key gets its own, saying which); without it they are errors, so a typo is
                  never ignored. Other problems still stop the run.
  -h, --help      show this help

{OVERRIDE_HELP}
"""

_CONFIG_OPTIONS = ("config", "config_file")
_ACTIONS = ("print_config", "dry_run", "json", "ignore_unknown_keys")


@dataclass(frozen=True)
class CliArgs:
    """The parsed command line."""

    config_paths: tuple[str, ...] = ()  # in the order given: later files win
    overrides: list[tuple[str, RawValue]] = field(default_factory=list)
    print_config: bool = False
    dry_run: bool = False
    json: bool = False  # with dry_run: the plan as one JSON document
    ignore_unknown_keys: bool = False  # load files without the keys no tool defines


def _error(text: str, key: str | None = None) -> ConfigError:
    return Origin(COMMAND_LINE).error(text, key)


def _is_option(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def _take_value(name: str, inline: str | None, argv: list[str], i: int) -> tuple[RawValue, int]:
    """The raw value of option ``name`` whose token is argv[i]; returns (value, next index)."""
    if inline is not None:
        return inline, i + 1
    rest = argv[i + 1 :]
    if name in _ACTIONS or is_bool_key(name):
        if rest and rest[0].lower() in ("true", "false"):
            return rest[0], i + 2
        return None, i + 1
    if is_list_key(name):
        n = next((k for k, t in enumerate(rest) if _is_option(t)), len(rest))
        return list(rest[:n]), i + 1 + n
    if not rest or _is_option(rest[0]):
        raise _error(f'option "--{name}" needs a value')
    return rest[0], i + 2


def _flag(name: str, raw: RawValue) -> bool:
    if raw is None:
        return True
    if isinstance(raw, str) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise _error(f'option "--{name}" takes true or false, got "{raw}"')


def wants_json(argv: list[str]) -> bool:
    """Whether the command line asks for the dry run's JSON document (--dry_run --json, no
    --print_config), judged from the tokens alone, so a refused command line still gets JSON."""
    names = {token[2:].partition("=")[0].replace("-", "_") for token in argv if _is_option(token)}
    return {"dry_run", "json"} <= names and "print_config" not in names


def parse_cli(argv: list[str]) -> CliArgs:
    """Parse the arguments after the program name.

    Raises ConfigError for bad usage (unknown option with the nearest valid one, missing
    value, stray argument); ``-h``/``--help`` prints the usage and raises SystemExit(0).
    """
    if any(t in ("-h", "--help") for t in argv):
        print(USAGE, end="")
        raise SystemExit(0)
    config_paths: list[str] = []
    actions = dict.fromkeys(_ACTIONS, False)
    overrides: list[tuple[str, RawValue]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not _is_option(token):
            raise _error(f'unexpected argument "{token}"; options start with --')
        name, sep, text = token[2:].partition("=")
        name = name.replace("-", "_")
        inline = text if sep else None
        if name not in _CONFIG_OPTIONS and name not in _ACTIONS:
            canonical = ALIASES.get(name, name)
            if key_kind(canonical) in ("dataset", "unknown"):
                extra = _CONFIG_OPTIONS + _ACTIONS
                raise _error(flat_key_problem(name, Origin(COMMAND_LINE), extra), name)
        raw, i = _take_value(name, inline, argv, i)
        if name in _CONFIG_OPTIONS:
            config_paths.append(raw)
        elif name in _ACTIONS:
            actions[name] = _flag(name, raw)
        else:
            overrides.append((name, raw))
    if actions["json"] and (actions["print_config"] or not actions["dry_run"]):
        raise _error(
            "--json prints the plan of a dry run: use it with --dry_run, without --print_config"
        )
    return CliArgs(tuple(config_paths), overrides, **actions)
