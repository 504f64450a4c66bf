"""Command-line parsing and overrides: forms, typing, precedence over the file."""

from __future__ import annotations

import pytest

from library.config.cli_args import CliArgs, parse_cli
from library.config.loader import load_config
from library.errors import ConfigError

FILE = """\
pretrained_model_name_or_path = "m"
learning_rate = 1e-4
gradient_checkpointing = true
output_name = "from_file"
resolution = 512
[[datasets]]
[[datasets.subsets]]
image_dir = "img"
"""


def test_parse_cli_forms():
    args = parse_cli(
        [
            "--config_file",
            "a.toml",
            "--learning_rate=3e-4",
            "--gradient_checkpointing",
            "--v2",
            "false",
            "--network_args",
            "conv_dim=4",
            "conv_alpha=2",
            "--seed",
            "-1",
            "--print_config",
            "--dry_run",
        ]
    )
    assert args == CliArgs(
        config_paths=("a.toml",),
        overrides=[
            ("learning_rate", "3e-4"),
            ("gradient_checkpointing", None),
            ("v2", "false"),
            ("network_args", ["conv_dim=4", "conv_alpha=2"]),
            ("seed", "-1"),
        ],
        print_config=True,
        dry_run=True,
    )
    assert parse_cli(["--config", "b.toml"]) == CliArgs(config_paths=("b.toml",))
    assert parse_cli(["--dry_run=false"]).dry_run is False
    # several files are layers, in the order given; --config_file is the same option
    layered = parse_cli(["--config", "a", "--config_file=b", "--seed", "1", "--config", "c"])
    assert layered.config_paths == ("a", "b", "c")
    assert layered.overrides == [("seed", "1")]
    assert parse_cli(["--dry_run", "--json"]).json is True


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--learning_rat", "1"],
            'unknown option "--learning_rat"; did you mean "--learning_rate"?',
        ),
        (["--dryrun"], 'did you mean "--dry_run"?'),
        (["--learning_rate"], 'option "--learning_rate" needs a value'),
        (["--config"], 'option "--config" needs a value'),
        (["stray"], 'unexpected argument "stray"'),
        (["--num_repeats", "2"], '"num_repeats" is a dataset key'),
        (["--json"], "--json prints the plan of a dry run"),
        (["--dry_run", "--print_config", "--json"], "without --print_config"),
        (["--print_config", "--json"], "--json prints the plan of a dry run"),
        (["--print_config", "maybe"], 'unexpected argument "maybe"'),
    ],
)
def test_bad_usage_is_a_config_error(argv, expected):
    with pytest.raises(ConfigError) as info:
        parse_cli(argv)
    assert str(info.value).startswith("config error in command line: ")
    assert expected in str(info.value)


def test_help_prints_override_syntax(capsys):
    with pytest.raises(SystemExit) as info:
        parse_cli(["--seed", "1", "-h"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and "--flag false" in out and "docs/config.md" in out


def test_overrides_win_over_the_file_and_are_typed(write_toml):
    path = write_toml("a.toml", FILE)
    args = parse_cli(
        [
            "--config",
            path,
            "--learning_rate",
            "5e-5",
            "--gradient_checkpointing",
            "false",
            "--output_name",
            "123",
            "--resolution",
            "768,512",
            "--train_batch_size",
            "3",
            "--optimizer_type",
            "adamw",
            "--network_args",
            "conv_dim=8",
            "--max_train_steps=10",
            "--min_snr_gamma",
            "5",
        ]
    )
    cfg = load_config(args.config_paths, args.overrides)
    assert cfg.optimizer.learning_rate == 5e-5
    assert cfg.training.gradient_checkpointing is False
    assert cfg.saving.output_name == "123"  # a str key keeps the text
    assert cfg.data.resolution == "768,512"
    assert (cfg.datasets[0].resolution, cfg.datasets[0].batch_size) == ([768, 512], 3)
    assert cfg.optimizer.optimizer_type == "AdamW"
    assert cfg.network.conv_dim == 8
    assert cfg.training.max_train_steps == 10
    assert cfg.training.min_snr_gamma == 5.0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], True),
        (["--gradient_checkpointing"], True),
        (["--gradient_checkpointing", "true"], True),
        (["--gradient_checkpointing", "False"], False),
        (["--gradient_checkpointing=false"], False),
    ],
)
def test_bool_flag_forms(write_toml, argv, expected):
    path = write_toml("a.toml", FILE)
    cfg = load_config(path, parse_cli(argv).overrides)
    assert cfg.training.gradient_checkpointing is expected


def test_bad_override_value_names_command_line(write_toml):
    path = write_toml("a.toml", FILE)
    with pytest.raises(ConfigError) as info:
        load_config(path, parse_cli(["--learning_rate", "fast"]).overrides)
    assert str(info.value) == (
        'config error in command line: key "learning_rate" = "fast" is not valid: expected a number'
    )
    with pytest.raises(ConfigError, match='"torch_compile" is not supported'):
        load_config(path, parse_cli(["--torch_compile"]).overrides)
    cfg = load_config(path, parse_cli(["--torch_compile", "false", "--xformers=false"]).overrides)
    assert cfg == load_config(path)
    # a switch that changes no result is accepted, and said to be ignored
    cfg = load_config(path, parse_cli(["--lowram"]).overrides)
    assert cfg.notices == ("command line: lowram = true is ignored: difftune places the models "
                           "itself, and this changes no result",)


def test_no_file_with_model_on_command_line(tmp_path):
    overrides = [("pretrained_model_name_or_path", "m"), ("train_data_dir", str(tmp_path / "t"))]
    (tmp_path / "t" / "2_x").mkdir(parents=True)
    pytest.importorskip("library.data.folders")
    cfg = load_config(None, overrides)
    assert cfg.datasets[0].subsets[0].num_repeats == 2
    with pytest.raises(ConfigError, match='option "--seed" needs a value'):
        load_config(None, overrides + [("seed", None)])


def test_dataset_sizes_on_the_command_line_win_over_the_tables(write_toml):
    """--resolution and --train_batch_size replace what [general], [[datasets]] and subsets
    say, with a warning naming each table value replaced; no value is dropped silently."""
    path = write_toml(
        "a.toml",
        """\
        pretrained_model_name_or_path = "m"
        [general]
        caption_extension = ".caption"
        [[datasets]]
        resolution = 512
        batch_size = 2
        [[datasets.subsets]]
        image_dir = "a"
        [[datasets]]
        [[datasets.subsets]]
        image_dir = "b"
        caption_extension = ".txt"
        """,
    )
    argv = ["--resolution", "768,512", "--train_batch_size", "4", "--caption_extension", ".md"]
    cfg = load_config(path, parse_cli(argv).overrides)
    assert [tuple(d.resolution) for d in cfg.datasets] == [(768, 512)] * 2
    assert [d.batch_size for d in cfg.datasets] == [4, 4]
    assert [d.subsets[0].caption_extension for d in cfg.datasets] == [".md"] * 2
    replaced = [n for n in cfg.notices if "is replaced by" in n]
    assert replaced == [
        f"{path}: batch_size = 2 in datasets[0] is replaced by --train_batch_size 4 (the "
        "command line wins over the files)",
        f"{path}: resolution = 512,512 in datasets[0] is replaced by --resolution 768,512 (the "
        "command line wins over the files)",
        f'{path}: caption_extension = ".caption" in [general] is replaced by --caption_extension '
        '".md" (the command line wins over the files)',
        f'{path}: caption_extension = ".txt" in datasets[1].subsets[0] is replaced by '
        '--caption_extension ".md" (the command line wins over the files)',
    ]
    # the same value on the command line replaces nothing, so it says nothing
    same = load_config(path, parse_cli(["--resolution", "512"]).overrides)
    assert not [n for n in same.notices if "is replaced by" in n]
    # without the command line the tables win over the file's plain arguments, as in kohya
    plain = load_config(path)
    assert [tuple(d.resolution) for d in plain.datasets] == [(512, 512), (512, 512)]
    assert [d.batch_size for d in plain.datasets] == [2, 1]
