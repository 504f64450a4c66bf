"""Mistakes in config files are one-line ConfigErrors naming the file, the key and the fix."""

from __future__ import annotations

import re

import pytest

from library.config.loader import load_config
from library.errors import ConfigError
from tests.config.config_helpers import error_of

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'



def test_unknown_key_names_file_table_and_nearest_key(write_toml):
    path = write_toml("my.toml", HEAD + "[training_arguments]\nlearning_rat = 1e-4\n" + DATASET)
    assert error_of(path) == (
        f'config error in {path}: unknown key "learning_rat" in [training_arguments]; '
        'did you mean "learning_rate"? (or load the file without it: --ignore_unknown_keys)'
    )


def test_unknown_key_without_close_match_points_to_docs(write_toml):
    path = write_toml("my.toml", HEAD + "zzqqxx = 1\n" + DATASET)
    message = error_of(path)
    assert 'unknown key "zzqqxx" at the top level' in message
    assert "docs/config.md" in message and "did you mean" not in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('learning_rate = "fast"', 'key "learning_rate" = "fast" is not valid: expected a number'),
        ("network_dim = 0", 'key "network_dim" = 0 is not valid: expected a whole number >= 1'),
        (
            "gradient_checkpointing = 2",
            'key "gradient_checkpointing" = 2 is not valid: expected true or false',
        ),
        (
            'mixed_precision = "fp32"',
            'key "mixed_precision" = "fp32" is not valid: expected one of "no", "fp16", "bf16"',
        ),
        ("seed = 1.5", 'key "seed" = 1.5 is not valid: expected a whole number'),
        ('resolution = "big"', 'key "resolution" = "big" is not valid: expected "512"'),
    ],
)
def test_wrong_type_names_key_value_and_expectation(write_toml, line, expected):
    path = write_toml("t.toml", HEAD + line + "\n" + DATASET)
    message = error_of(path)
    assert message.startswith(f"config error in {path}: {expected}")


def test_model_level_check_is_one_line(write_toml):
    path = write_toml(
        "t.toml",
        HEAD + "network_train_unet_only = true\nnetwork_train_text_encoder_only = true\n" + DATASET,
    )
    assert error_of(path).startswith(f"config error in {path}: network_train_unet_only and")


def test_dataset_key_error_names_dataset_file_and_location(write_toml):
    dataset = write_toml(
        "d.toml",
        """\
        [[datasets]]
          [[datasets.subsets]]
          image_dir = "a"
          [[datasets.subsets]]
          image_dir = "b"
          num_repeats = "ten"
        """,
    )
    path = write_toml("a.toml", HEAD + f"dataset_config = {dataset!r}\n")
    assert error_of(path) == (
        f'config error in {dataset}: key "datasets[0].subsets[1].num_repeats" = "ten" is not '
        "valid: expected a whole number"
    )


def test_value_from_general_is_blamed_on_general(write_toml):
    path = write_toml("a.toml", HEAD + "[general]\nnum_repeats = -1\n" + DATASET)
    assert 'key "general.num_repeats" = -1 is not valid' in error_of(path)


def test_unknown_and_misplaced_dataset_keys(write_toml):
    path = write_toml(
        "a.toml", HEAD + "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\nnum_repeat = 2\n"
    )
    assert error_of(path) == (
        f'config error in {path}: unknown key "num_repeat" in datasets[0].subsets[0]; '
        'did you mean "num_repeats"? (or load the file without it: --ignore_unknown_keys)'
    )
    path = write_toml(
        "b.toml", HEAD + "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\nbatch_size = 2\n"
    )
    assert '"batch_size" is a dataset key' in error_of(path)
    path = write_toml("c.toml", HEAD + "num_repeats = 3\n" + DATASET)
    assert '"num_repeats" is a dataset key; set it in [[datasets.subsets]]' in error_of(path)
    path = write_toml("d.toml", "[general]\nlearning_rate = 1.0\n" + DATASET)
    dataset = path
    path = write_toml("e.toml", HEAD + f"dataset_config = {dataset!r}\n")
    assert '"learning_rate" is a training argument' in error_of(path)


def test_missing_subset_image_dir_and_missing_subsets(write_toml):
    path = write_toml("a.toml", HEAD + "[[datasets]]\n[[datasets.subsets]]\nnum_repeats = 2\n")
    assert "datasets[0].subsets[0]: a subset needs image_dir" in error_of(path)
    path = write_toml("b.toml", HEAD + "[[datasets]]\nbatch_size = 2\n")
    assert "datasets[0] has no subsets" in error_of(path)


def test_key_given_twice_names_both_tables(write_toml):
    path = write_toml("a.toml", HEAD + "[a]\nseed = 1\n[b]\nseed = 2\n" + DATASET)
    assert error_of(path) == (
        f'config error in {path}: "seed" is set twice with different values: 1 in [a] and 2 in '
        "[b]; keep one"
    )
    path = write_toml(
        "b.toml", HEAD + 'caption_extension = ".a"\ncaption_extention = ".b"\n' + DATASET
    )
    assert '"caption_extension" is set twice with different values' in error_of(path)
    # the same value twice is one setting (kohya flattens the tables)
    path = write_toml("c.toml", HEAD + "[a]\nseed = 3\n[b]\nseed = 3\n" + DATASET)
    assert load_config(path).training.seed == 3
    # 1 and 1.0 are the same number; a true/false key reads 1 as true and 0 as false
    path = write_toml(
        "d.toml", HEAD + "[a]\nmax_grad_norm = 1\n[b]\nmax_grad_norm = 1.0\n" + DATASET
    )
    assert load_config(path).optimizer.max_grad_norm == 1
    path = write_toml("e.toml", HEAD + "[a]\nsdpa = true\n[b]\nsdpa = 1\n" + DATASET)
    assert load_config(path).training.sdpa is True
    path = write_toml("f.toml", HEAD + "[a]\nsdpa = true\n[b]\nsdpa = 0\n" + DATASET)
    assert "is set twice with different values: true in [a] and false in [b]" in error_of(path)


def test_unreadable_files(tmp_path, write_toml):
    missing = str(tmp_path / "nope.toml")
    assert error_of(missing) == f"config file not found: {missing}"
    path = write_toml("bad.toml", "a = 1\nb = \n")
    message = error_of(path)
    assert message.startswith(f"config error in {path}: not valid TOML") and "line 2" in message
    dataset = write_toml("a.toml", HEAD + 'dataset_config = "no_such_dataset.toml"\n')
    assert "no_such_dataset.toml" in error_of(dataset)


def test_no_model_no_config_no_images(write_toml):
    with pytest.raises(ConfigError, match="pass --config"):
        load_config(None)
    path = write_toml("a.toml", DATASET)
    assert '"pretrained_model_name_or_path" is missing' in error_of(path)
    path = write_toml("b.toml", HEAD)
    assert re.search("set train_data_dir, dataset_config or \\[\\[datasets\\]\\]", error_of(path))


def test_dataset_sources_conflict(write_toml):
    dataset = write_toml("d.toml", DATASET)
    path = write_toml("a.toml", HEAD + f"dataset_config = {dataset!r}\n" + DATASET)
    assert "dataset_config and [[datasets]] both give the training images" in error_of(path)
    path = write_toml("b.toml", HEAD + 'train_data_dir = "t"\n' + DATASET)
    assert "train_data_dir and [[datasets]]" in error_of(path)
    path = write_toml(
        "g.toml", HEAD + f"dataset_config = {dataset!r}\n[general]\nnum_repeats = 2\n"
    )
    assert "cannot be combined with dataset_config" in error_of(path)
    path = write_toml("c.toml", HEAD + 'reg_data_dir = "r"\n' + DATASET)
    assert "reg_data_dir needs train_data_dir" in error_of(path)


@pytest.mark.parametrize(
    ("line", "fix"),
    [
        ("torch_compile = true", "remove it or set it to false"),
        ("network_dropout = 0.1", "remove it or set it to 0"),
        ('face_crop_aug_range = "2.0,4.0"', "remove it"),
        ("fused_optimizer_groups = 8", "remove it or set it to 0"),
        ("weighted_captions = true", "remove it or set it to false"),
    ],
)
def test_unsupported_kohya_key_is_an_error(write_toml, line, fix):
    path = write_toml("a.toml", HEAD + line + "\n" + DATASET)
    key = line.split(" =")[0]
    message = error_of(path)
    assert message.startswith(f'config error in {path}: "{key}" is not supported')
    assert message.endswith(fix)


def test_unsupported_key_in_dataset_names_location(write_toml):
    path = write_toml(
        "a.toml",
        HEAD + "[[datasets]]\nface_crop_aug_range = '2,4'\n[[datasets.subsets]]\nimage_dir = 'a'\n",
    )
    assert '"datasets[0].face_crop_aug_range" is not supported yet' in error_of(path)


def test_off_values_are_accepted_and_change_nothing(write_toml):
    off = """\
        cache_latents = false
        cache_latents_to_disk = false
        enable_bucket = false
        min_bucket_reso = 256
        xformers = false
        keep_tokens = 0
        caption_dropout_rate = 0.0
        lr_scheduler_args = []
        loss_type = "l2"
        [general]
        shuffle_caption = false
        flip_aug = false
        [[datasets]]
        enable_bucket = false
          [[datasets.subsets]]
          image_dir = "img"
          color_aug = false
          token_warmup_min = 1
        """
    with_off = load_config(write_toml("a.toml", HEAD + off))
    plain = load_config(write_toml("b.toml", HEAD + DATASET))
    # the plain dataset keys are kept as written (for --print_config) and change nothing else
    assert with_off.dataset_defaults == {
        "keep_tokens": 0,
        "caption_dropout_rate": 0.0,
        "min_bucket_reso": 256,
        "enable_bucket": False,
    }
    assert with_off.model_copy(update={"dataset_defaults": {}}) == plain


def test_kohya_value_errors(write_toml):
    cases = {
        'optimizer_type = "DAdaptAdam"': 'optimizer_type = "DAdaptAdam" is not supported (D-Adapt',
        'optimizer_type = "Lionn"': 'did you mean "Lion"?',
        'network_module = "networks.dylora"': 'network_module = "networks.dylora" is not supported',
        'network_module = "lycoris.kohya"\nnetwork_args = ["algo=ia3"]': "LyCORIS' IA3 is not "
        "supported",
        'lr_scheduler = "cosine_with_min_lr"': 'lr_scheduler = "cosine_with_min_lr" needs its '
        "floor: set lr_scheduler_min_lr_ratio",
        'lr_scheduler = "inverse_sqrt"\nlr_scheduler_args = ["num_cycles=2"]': 'lr_scheduler_args '
        '"num_cycles" is not an argument of lr_scheduler = "inverse_sqrt" (it takes: none)',
        'lr_scheduler = "piecewise_constant"\nlr_scheduler_args = ["step_rules=1:x"]': "step_rules "
        '= "1:x": give a text like "1:100,0.5:200,0.1"',
        'lr_scheduler = "piecewise_constant"': 'needs lr_scheduler_args "step_rules=',
        'lr_scheduler = "warmup_stable_decay"\nlr_scheduler_args = ["decay_type=\'exp\'"]': 'give '
        '"linear" or "cosine" or "1-sqrt"',
        'network_args = ["algo=locon"]': 'algo is a LyCORIS option; set network_module = "lycoris',
        'network_args = ["dropout=0.1"]': 'network_args "dropout=0.1" is not supported (dropout',
        'network_args = ["conv_dim=8"]\nconv_dim = 4': "conv_dim = 4 conflicts with network_args",
        'optimizer_args = ["weight_decay"]': 'optimizer_args item "weight_decay" is not',
    }
    for i, (line, expected) in enumerate(cases.items()):
        path = write_toml(f"{i}.toml", HEAD + line + "\n" + DATASET)
        message = error_of(path)
        assert message.startswith(f"config error in {path}: ") and expected in message, line
