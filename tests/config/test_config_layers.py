"""Layered config files: --config base.toml --config run.toml [--key value ...].

A later file wins over an earlier one key by key and the command line wins over all files; a
file that gives the training images replaces the earlier files' data as a whole; errors name the
file (and table) the bad key came from; every value knows where it came from."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from library.config.cli_args import parse_cli
from library.config.loader import load_config
from library.config.provenance import provenance
from library.config.render import render_toml
from library.errors import ConfigError
from tests.config.config_helpers import error_of

BASE = """\
[model_arguments]
pretrained_model_name_or_path = "m"
[training_arguments]
learning_rate = 1e-4
seed = 3
min_snr_gamma = 5.0
max_train_steps = 100
[saving_arguments]
output_name = "base"
[[datasets]]
batch_size = 2
[[datasets.subsets]]
image_dir = "base_images"
num_repeats = 3
"""


def base_with(lines: str) -> str:
    """BASE with more flat keys (placed before its [[datasets]])."""
    return BASE.replace("[[datasets]]", lines + "[[datasets]]", 1)


RUN = """\
[training]
learning_rate = 5e-5
min_snr_gamma = 0
output_name = "run"
"""


def load(write_toml, *files: tuple[str, str], argv: tuple[str, ...] = ()):
    paths = [write_toml(name, text) for name, text in files]
    args = parse_cli([a for p in paths for a in ("--config", p)] + list(argv))
    return load_config(args.config_paths, args.overrides), paths


def test_later_file_wins_key_by_key_and_command_line_wins_over_all(write_toml):
    cfg, (base, run) = load(write_toml, ("base.toml", BASE), ("run.toml", RUN))
    assert cfg.optimizer.learning_rate == 5e-5  # run.toml
    assert cfg.training.seed == 3  # base.toml only
    assert cfg.training.max_train_steps == 100
    assert cfg.saving.output_name == "run"
    assert cfg.training.min_snr_gamma is None  # kohya's 0 ("off") in a later file clears it
    assert cfg.datasets[0].subsets[0].image_dir == "base_images"
    # the other order: base.toml wins
    again, _ = load(write_toml, ("run.toml", RUN), ("base.toml", BASE))
    assert (again.optimizer.learning_rate, again.saving.output_name) == (1e-4, "base")
    assert again.training.min_snr_gamma == 5.0
    # the command line wins over both files, wherever it stands among the --config options
    paths = [base, run]
    args = parse_cli(["--seed", "9", "--config", base, "--learning_rate=2e-4", "--config", run])
    assert args.config_paths == tuple(paths)
    cli = load_config(args.config_paths, args.overrides)
    assert (cli.training.seed, cli.optimizer.learning_rate) == (9, 2e-4)
    # --key "" clears what any file set
    cli = load_config(paths, [("max_train_steps", "")])
    assert cli.training.max_train_steps is None


def test_within_one_file_the_flattening_rules_stay(write_toml):
    twice = base_with("[other]\nseed = 4\n")
    path = write_toml("twice.toml", twice)
    run = write_toml("run.toml", RUN)
    # a key given twice with different values in one file is an error naming that file, even
    # when a later file sets the same key
    assert error_of([run, path]) == (
        f'config error in {path}: "seed" is set twice with different values: 3 in '
        "[training_arguments] and 4 in [other]; keep one"
    )
    # the same value in two tables of one file is one setting; across files no conflict arises
    same = write_toml("same.toml", base_with("[other]\nseed = 3\n"))
    cfg = load_config([same, write_toml("seed.toml", "seed = 8\n")])
    assert cfg.training.seed == 8


def test_errors_name_the_file_and_table_of_the_bad_key(write_toml):
    base = write_toml("base.toml", BASE)
    bad = write_toml("bad.toml", "[training_arguments]\nlearning_rat = 1e-4\n")
    # unknown keys are errors in every file, also in one whose values a later file overrides
    assert error_of([bad, base]) == (
        f'config error in {bad}: unknown key "learning_rat" in [training_arguments]; '
        'did you mean "learning_rate"? (or load the file without it: --ignore_unknown_keys)'
    )
    # a bad value names the layer whose value won
    wrong = write_toml("wrong.toml", '[opt]\nlearning_rate = "fast"\n')
    assert error_of([base, wrong]).startswith(f'config error in {wrong}: key "learning_rate"')
    wrong_base = write_toml("wrong_base.toml", BASE.replace("seed = 3", 'seed = "x"'))
    assert error_of([wrong_base, write_toml("r.toml", RUN)]).startswith(
        f'config error in {wrong_base}: key "seed" = "x"'
    )
    # and a later file's value replaces the earlier bad one, as the command line does
    assert load_config([wrong_base, write_toml("fix.toml", "seed = 1\n")]).training.seed == 1
    # a dataset key: the file and the dataset table
    bad_dataset = BASE.replace("num_repeats = 3", "num_repeat = 3")
    path = write_toml("bad_dataset.toml", bad_dataset)
    message = error_of([path, base])  # base.toml's datasets replace these, yet the key is wrong
    assert message.startswith(f"config error in {path}: ")
    assert 'unknown key "num_repeat" in datasets[0].subsets[0]' in message
    # a dataset value: the file that defined the datasets in use
    path = write_toml("bad_value.toml", BASE.replace("num_repeats = 3", "num_repeats = -1"))
    message = error_of([path, write_toml("r.toml", RUN)])
    assert message.startswith(f'config error in {path}: key "datasets[0].subsets[0].num_repeats"')
    # the model missing from every file names them all
    no_model = write_toml("no_model.toml", "seed = 1\n")
    run = write_toml("run.toml", RUN)
    assert error_of([no_model, run]).startswith(
        f'config error in {no_model} and {run}: "pretrained_model_name_or_path" is missing'
    )


def test_a_file_that_gives_datasets_replaces_the_earlier_datasets_whole(write_toml, tmp_path):
    general = base_with("[general]\nkeep_tokens = 2\nshuffle_caption = true\n")
    general = general.replace("[[datasets]]", "[[datasets]]\nenable_bucket = true", 1)
    base = write_toml("base.toml", general)
    other = """\
[[datasets]]
[[datasets.subsets]]
image_dir = "run_a"
[[datasets.subsets]]
image_dir = "run_b"
num_repeats = 2
"""
    cfg = load_config([base, write_toml("run.toml", other)])
    (dataset,) = cfg.datasets
    assert [s.image_dir for s in dataset.subsets] == ["run_a", "run_b"]
    # nothing of base.toml's datasets or [general] is left; its flat keys are
    assert dataset.batch_size == 1 and not dataset.enable_bucket
    assert [(s.keep_tokens, s.shuffle_caption) for s in dataset.subsets] == [(0, False)] * 2
    assert cfg.optimizer.learning_rate == 1e-4
    # a file without datasets keeps the earlier ones; its [general] keys layer key by key
    cfg = load_config([base, write_toml("g.toml", "[general]\nkeep_tokens = 1\n")])
    (subset,) = cfg.datasets[0].subsets
    assert (subset.image_dir, subset.keep_tokens, subset.shuffle_caption) == (
        "base_images",
        1,
        True,
    )
    assert cfg.datasets[0].enable_bucket and cfg.datasets[0].batch_size == 2
    # dataset keys written flat are defaults that layer like any key and outlive a dataset change
    flat = write_toml("flat.toml", "caption_dropout_rate = 0.25\ntrain_batch_size = 3\n")
    cfg = load_config([flat, base, write_toml("run.toml", other)])
    assert [s.caption_dropout_rate for s in cfg.datasets[0].subsets] == [0.25, 0.25]
    assert cfg.datasets[0].batch_size == 3


def test_train_data_dir_and_dataset_config_replace_datasets_across_layers(write_toml, tmp_path):
    pytest.importorskip("library.data.folders")
    (tmp_path / "train" / "4_dog").mkdir(parents=True)
    (tmp_path / "reg" / "1_animal").mkdir(parents=True)
    base = write_toml("base.toml", BASE)
    folders = f"train_data_dir = {str(tmp_path / 'train')!r}\n"
    folders += f"reg_data_dir = {str(tmp_path / 'reg')!r}\n"
    folder_file = write_toml("folders.toml", folders)
    cfg = load_config([base, folder_file])
    subsets = cfg.datasets[0].subsets
    assert [(s.num_repeats, s.is_reg) for s in subsets] == [(4, False), (1, True)]
    assert cfg.datasets[0].batch_size == 1  # base.toml's [[datasets]] batch_size went with them
    # [[datasets]] after train_data_dir drops train_data_dir and reg_data_dir too
    cfg = load_config([folder_file, base])
    assert cfg.data.train_data_dir is None and cfg.data.reg_data_dir is None
    assert [s.image_dir for s in cfg.datasets[0].subsets] == ["base_images"]
    # a later reg_data_dir alone adds to the data in place
    reg_only = write_toml("reg.toml", f"reg_data_dir = {str(tmp_path / 'reg')!r}\n")
    assert "reg_data_dir needs train_data_dir" in error_of([base, reg_only])
    # dataset_config replaces inline datasets; the command line is one more layer
    dataset = write_toml("d.toml", "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'from_d'\n")
    cfg = load_config([base], [("dataset_config", dataset)])
    assert [s.image_dir for s in cfg.datasets[0].subsets] == ["from_d"]
    cfg = load_config([base], [("train_data_dir", str(tmp_path / "train"))])
    assert cfg.datasets[0].subsets[0].num_repeats == 4
    # two sources in one layer are still an error naming that layer
    both = write_toml("both.toml", base_with(f"dataset_config = {dataset!r}\n"))
    assert error_of([both, base]) == (
        f"config error in {both}: dataset_config and [[datasets]] both give the training "
        "images; use one"
    )
    # [general] from a later file cannot go with an earlier file's dataset_config
    with_config = write_toml(
        "c.toml", f'pretrained_model_name_or_path = "m"\ndataset_config = {dataset!r}\n'
    )
    general = write_toml("general.toml", "[general]\nkeep_tokens = 1\n")
    assert error_of([with_config, general]).startswith(
        f"config error in {general}: [general] dataset keys in the config file cannot be combined"
    )


def test_network_args_and_their_keys_layer_like_other_keys(write_toml):
    base = write_toml("base.toml", base_with('network_args = ["conv_dim=8", "conv_alpha=4"]\n'))
    run = write_toml("run.toml", "conv_dim = 2\n")
    cfg = load_config([base, run])
    assert (cfg.network.conv_dim, cfg.network.conv_alpha) == (2, 4.0)
    cfg = load_config([run, base])
    assert cfg.network.conv_dim == 8
    # within one file the conflict is still an error
    both = write_toml("both.toml", base_with('conv_dim = 2\nnetwork_args = ["conv_dim=8"]\n'))
    assert "conv_dim = 2 conflicts with network_args" in error_of([both])


def test_notices_name_each_file(write_toml):
    base = write_toml("base.toml", base_with("epoch = 3\n"))
    run = write_toml("run.toml", "noise_offset_type = 'Original'\n")
    notices = load_config([base, run]).notices
    assert [n.split(":")[0] for n in notices] == [base, run]


def test_provenance_names_the_winning_source_of_every_key(write_toml):
    cfg, (base, run) = load(
        write_toml,
        ("base.toml", base_with("shuffle_caption = true\n")),
        ("run.toml", RUN),
        argv=("--seed", "11", "--network_dim", "8"),
    )
    origin = provenance(cfg)
    assert origin.files == (base, run)
    assert origin.command_line == ("seed", "network_dim")
    assert origin.source("learning_rate") == run
    assert origin.source("max_train_steps") == base
    assert origin.source("seed") == "command line"
    assert origin.source("network_alpha") == "default"
    assert origin.source("shuffle_caption") == base
    assert origin.source("datasets[0].batch_size") == base
    assert origin.source("datasets[0].resolution") == "default"
    assert origin.source("datasets[0].subsets[0].num_repeats") == base
    assert origin.source("datasets[0].subsets[0].shuffle_caption") == base


def _marks(text: str) -> dict[str, str]:
    """{"[table] key": source} from render_toml's "key = value  # source" lines."""
    marks, table = {}, ""
    for line in text.splitlines():
        line = line.removeprefix("# ")
        if line.startswith("["):
            table = line
        match = re.match(r"^(\w+) = .*  # (.+)$", line)
        if match:
            marks.setdefault(f"{table} {match[1]}", match[2])
    return marks


def test_print_config_marks_every_key_and_loads_back_the_same(write_toml):
    cfg, (base, run) = load(
        write_toml,
        ("base.toml", base_with("shuffle_caption = true\n")),
        ("run.toml", RUN),
        argv=("--seed", "11"),
    )
    text = render_toml(cfg)
    assert f"# Layers, later ones winning: {base}; {run}; command line (seed)" in text
    marks = _marks(text)
    assert marks["[optimizer] learning_rate"] == run
    assert marks["[training] max_train_steps"] == base
    assert marks["[training] seed"] == "command line"
    assert marks["[network] network_dim"] == "default"
    assert marks["[dataset_defaults] shuffle_caption"] == base
    assert marks["[[datasets]] batch_size"] == base
    assert marks["[[datasets.subsets]] image_dir"] == base
    # every key line carries a mark
    lines = [line for line in text.splitlines() if re.match(r"^\w+ = ", line)]
    assert lines and all(re.search(r"  # (default|command line|\S+\.toml)$", ln) for ln in lines)
    # the printed TOML loads back to the same config, and then says it came from that file
    again_path = write_toml("printed.toml", text)
    again = load_config(again_path)
    assert again == cfg
    assert tomllib.loads(render_toml(again)) == tomllib.loads(text)
    assert _marks(render_toml(again))["[training] seed"] == again_path


def test_layering_changes_nothing_a_resume_compares(write_toml):
    from library.training.resume_rules import flat_settings

    layered, _ = load(write_toml, ("base.toml", BASE), ("run.toml", RUN), argv=("--seed", "4"))
    merged = BASE.replace("learning_rate = 1e-4", "learning_rate = 5e-5")
    merged = merged.replace("min_snr_gamma = 5.0\n", "").replace("seed = 3", "seed = 4")
    merged = merged.replace('output_name = "base"', 'output_name = "run"')
    single = load_config(write_toml("single.toml", merged))
    # the same values, the same settings a state stores, whatever the layers
    assert layered == single
    assert flat_settings(layered) == flat_settings(single)
    stored = json.dumps(flat_settings(layered))
    assert "base.toml" not in stored and "command line" not in stored


@pytest.mark.parametrize(
    ("layers", "argv", "header"),
    [
        # a rule across sections: file against command line, with an uninvolved file between
        (["base", "other", "unet_only"], ["--cache_text_encoder_outputs"], None),
        (["base", "other"], ["--train_mode", "unet", "--fp8_base"], "command line"),
        # a rule within one section: two files, with an uninvolved file first
        (["base", "other", "unet_only", "te_only"], [], "unet_only.toml and te_only.toml"),
        (["base", "other", "unet_only"], ["--network_train_text_encoder_only"],
         "unet_only.toml and command line"),
        (["base", "other"], ["--full_bf16", "--mixed_precision", "fp16"], "command line"),
    ],
)  # fmt: skip
def test_a_conflict_between_layers_names_the_layers_involved(tmp_path, layers, argv, header):
    texts = {
        "base": 'pretrained_model_name_or_path = "m"\n[[datasets]]\n[[datasets.subsets]]\n'
        'image_dir = "i"\n',
        "other": "seed = 3\n",
        "unet_only": "network_train_unet_only = false\n",
        "te_only": "network_train_text_encoder_only = true\n",
    }
    if header is not None:
        texts["unet_only"] = "network_train_unet_only = true\n"
    paths = []
    for name in layers:
        (tmp_path / f"{name}.toml").write_text(texts[name])
        paths.append(str(tmp_path / f"{name}.toml"))
    with pytest.raises(ConfigError) as info:
        load_config(paths, parse_cli(argv).overrides)
    message = str(info.value)
    if header is None:  # written false in unet_only.toml, the cache on the command line
        header = "unet_only.toml and command line"
    shown = " and ".join(
        part if part == "command line" else str(tmp_path / part) for part in header.split(" and ")
    )
    assert message.startswith(f"config error in {shown}: "), message
    assert "base.toml" not in message and "other.toml" not in message
