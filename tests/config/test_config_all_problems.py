"""A config is refused once, naming every problem it has; --ignore_unknown_keys loads a file
without the keys no tool defines (a front end's leftovers), and nothing else."""

from __future__ import annotations

import pytest

from library.config.cli_args import parse_cli
from library.config.loader import load_config
from library.errors import ConfigError, exit_reason_of

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'

# Seven keys no tool defines, in the places a file can hold them, with the key each is near.
SEVEN = {
    "learning_rat": ("", "learning_rate"),
    "max_train_step": ("[training]", "max_train_steps"),
    "gradient_acumulation_steps": ("[training]", "gradient_accumulation_steps"),
    "optimiser_type": ("[training]", "optimizer_type"),
    "save_evry_n_epochs": ("[saving]", "save_every_n_epochs"),
    "zzqqxx": ("[saving]", None),
    "num_repeat": ("datasets[0].subsets[0]", "num_repeats"),
}
SEVEN_FILE = f"""\
{HEAD}learning_rat = 1e-4
[training]
max_train_step = 100
gradient_acumulation_steps = 2
optimiser_type = "AdamW"
[saving]
save_evry_n_epochs = 1
zzqqxx = 1
[[datasets]]
[[datasets.subsets]]
image_dir = "img"
num_repeat = 2
"""


def _refusal(path, overrides=(), **kw) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, **kw)
    return info.value


def test_seven_unknown_keys_are_named_in_one_refusal(write_toml):
    path = write_toml("leftovers.toml", SEVEN_FILE)
    error = _refusal(path)
    header, *lines = str(error).splitlines()
    assert header == (
        f"config error in {path}: 7 problems (--ignore_unknown_keys loads the file without these "
        "unknown keys):"
    )
    assert len(lines) == 7
    for (key, (where, near)), line in zip(SEVEN.items(), lines, strict=True):
        assert f'unknown key "{key}"' in line
        assert where in line
        assert (f'did you mean "{near}"?' in line) if near else ("no similar key" in line)
    # every problem is also there as data, with its file and key (for --dry_run --json)
    assert [(p.file, p.key) for p in error.problems] == [
        (path, key if not where.startswith("datasets") else f"{where}.{key}")
        for key, (where, _) in SEVEN.items()
    ]
    # the run summary and the JSON "error" field get one line
    assert "\n" not in exit_reason_of(error) and "did you mean" in exit_reason_of(error)


def test_other_problems_are_listed_with_the_unknown_keys(write_toml):
    path = write_toml(
        "mixed.toml",
        HEAD + 'learnin_rate = 1\nweighted_captions = true\nnetwork_dim = "eight"\n'
        "seed = 1\n[other]\nseed = 2\n" + DATASET,
    )
    header, *lines = str(_refusal(path)).splitlines()
    assert "4 problems" in header and "without its unknown key; the rest need a fix" in header
    assert any('unknown key "learnin_rate"' in line for line in lines)
    assert any('"weighted_captions" is not supported' in line for line in lines)
    assert any('key "network_dim" = "eight" is not valid' in line for line in lines)
    assert any('"seed" is set twice' in line for line in lines)


def test_one_problem_stays_one_line_and_names_the_switch_only_for_unknown_keys(write_toml):
    unknown = str(_refusal(write_toml("a.toml", HEAD + "learnin_rate = 1\n" + DATASET)))
    assert "\n" not in unknown and unknown.endswith("(or load the file without it: --ignore_unknown_keys)")
    typed = str(_refusal(write_toml("b.toml", HEAD + 'network_dim = "x"\n' + DATASET)))
    assert "\n" not in typed and "ignore_unknown_keys" not in typed


def test_ignore_unknown_keys_loads_without_them_and_says_which(write_toml):
    path = write_toml("leftovers.toml", SEVEN_FILE)
    config = load_config(path, ignore_unknown_keys=True)
    notices = [n for n in config.notices if "ignore_unknown_keys" in n]
    # a key no tool defines is named once; a near miss of a real key gets its own warning,
    # with the key it is close to (its value would otherwise vanish unnoticed)
    assert f"{path}: ignored zzqqxx (--ignore_unknown_keys): " in notices[-1]
    near = [(key, close) for key, (_, close) in SEVEN.items() if close]
    assert notices[:-1] == [
        f'{path}: ignored "{shown}" (--ignore_unknown_keys), its value unused: no tool defines '
        f'it, but did you mean "{close}"?'
        for shown, close in (
            (f"{SEVEN[key][0]}.{key}" if SEVEN[key][0].startswith("datasets") else key, close)
            for key, close in near
        )
    ]
    # what the unknown keys would have set is not set: the defaults stand
    assert config.training.max_train_steps is None and config.datasets[0].subsets[0].num_repeats == 1
    # a key that is known but would change the result, a wrong type: still refused
    bad = write_toml("bad.toml", SEVEN_FILE.replace("[saving]\n", '[saving]\nnetwork_dim = "x"\n'))
    error = str(_refusal(bad, ignore_unknown_keys=True))
    assert 'key "network_dim" = "x" is not valid' in error and "learning_rat" not in error
    # a typo on the command line is never ignored
    with pytest.raises(ConfigError, match='unknown option "--learnin_rate"'):
        load_config(path, [("learnin_rate", "1")], ignore_unknown_keys=True)


def test_ignore_unknown_keys_is_a_command_line_switch():
    assert parse_cli(["--config", "a.toml", "--ignore_unknown_keys"]).ignore_unknown_keys
    assert not parse_cli(["--config", "a.toml"]).ignore_unknown_keys


def test_a_rule_across_keys_names_where_each_value_came_from(write_toml):
    base = write_toml("base.toml", HEAD + "full_bf16 = true\n" + DATASET)
    error = str(_refusal(base, [("mixed_precision", "fp16")]))
    assert "full_bf16 = true needs mixed_precision" in error
    assert f"(full_bf16 from {base}, mixed_precision from the command line)" in error
    # two files: each key names its own
    run = write_toml("run.toml", 'mixed_precision = "fp16"\n')
    error = str(_refusal([base, run]))
    assert f"mixed_precision from {run}" in error and f"full_bf16 from {base}" in error
    # all from the one file the message names: nothing to add
    one = write_toml("one.toml", HEAD + 'full_bf16 = true\nmixed_precision = "fp16"\n' + DATASET)
    assert " from " not in str(_refusal(one)).partition("needs")[2]


@pytest.mark.parametrize("factor", [0, -2])
def test_lycoris_network_args_are_checked_at_config_load(write_toml, factor):
    path = write_toml(
        "l.toml",
        HEAD + 'network_module = "lycoris.kohya"\n'
        f'network_args = ["algo=lokr", "factor={factor}"]\n' + DATASET,
    )
    with pytest.raises(ConfigError, match=f'network_args "factor={factor}": factor must be -1'):
        load_config(path)
