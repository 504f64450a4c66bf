"""Sizes that cannot work are refused before anything loads, in one line: image sides above
8192 px, and a batch larger than the samples a dataset has per epoch."""

from __future__ import annotations

import pytest

from library.config.loader import load_config
from library.errors import ConfigError
from library.training.trainer import Trainer
from tests.config.config_helpers import error_of
from tests.data.data_helpers import index_color, write_image
from tests.integration.harness import reset_accelerate

HEAD = 'pretrained_model_name_or_path = "no-such-model"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'



@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "resolution = 100000\n" + DATASET,
            'key "resolution" = 100000 is not valid: each side must be at most 8192, '
            "got [100000, 100000]",
        ),
        (
            'resolution = "1024,16384"\n' + DATASET,
            'key "resolution" = "1024,16384" is not valid: each side must be at most '
            "8192, got [1024, 16384]",
        ),
        (
            "[[datasets]]\nresolution = [9000, 512]\n[[datasets.subsets]]\nimage_dir = 'img'\n",
            'key "datasets[0].resolution" = [9000, 512] is not valid: each side must be at most '
            "8192",
        ),
        (
            "enable_bucket = true\nmax_bucket_reso = 10000\n" + DATASET,
            'key "max_bucket_reso" = 10000 is not valid: expected a whole number <= 8192',
        ),
        (
            "sample_width = 100000\n" + DATASET,
            'key "sample_width" = 100000 is not valid: expected a whole number <= 8192',
        ),
        (
            "sample_height = 8200\n" + DATASET,
            'key "sample_height" = 8200 is not valid: expected a whole number <= 8192',
        ),
    ],
)
def test_sides_above_8192_are_refused(write_toml, text, expected):
    path = write_toml("t.toml", HEAD + text)
    assert error_of(path).startswith(f"config error in {path}: {expected}")


def test_resolution_on_the_command_line_is_refused_too(write_toml):
    path = write_toml("t.toml", HEAD + DATASET)
    message = error_of(path, [("resolution", "100000")])
    assert "each side must be at most 8192, got [100000, 100000]" in message


def test_8192_is_still_allowed(write_toml):
    text = "resolution = 8192\nsample_width = 8192\nsample_height = 8192\n"
    path = write_toml(
        "t.toml", HEAD + text + "enable_bucket = true\nmax_bucket_reso = 8192\n" + DATASET
    )
    config = load_config(path)
    assert config.datasets[0].resolution == [8192, 8192]
    assert config.datasets[0].max_bucket_reso == 8192
    assert (config.sampling.sample_width, config.sampling.sample_height) == (8192, 8192)


# --- batch size against the samples per epoch --------------------------------------------------


def _images(folder, count):
    for i in range(count):
        write_image(folder / f"{i}.png", index_color(i), size=(64, 64))
    return folder


def _trainer_error(config) -> str:
    reset_accelerate()
    try:
        with pytest.raises(ConfigError) as info:
            Trainer(config)  # nothing may load before the refusal
    finally:
        reset_accelerate()
    message = str(info.value)
    assert "\n" not in message
    return message


def _config(write_toml, tmp_path, model, batch, repeats=1, reg=False):
    train = _images(tmp_path / "train", 2)
    subsets = f'[[datasets.subsets]]\nimage_dir = "{train}"\nnum_repeats = {repeats}\n'
    if reg:
        regs = _images(tmp_path / "reg", 3)
        subsets += f'[[datasets.subsets]]\nimage_dir = "{regs}"\nis_reg = true\n'
    head = f'pretrained_model_name_or_path = "{model}"\n'
    text = head + f"train_batch_size = {batch}\n[[datasets]]\nresolution = 64\n" + subsets
    return load_config(write_toml("t.toml", text))


def test_a_batch_larger_than_the_samples_per_epoch_is_refused(write_toml, tmp_path, tiny_model_dir):
    message = _trainer_error(_config(write_toml, tmp_path, tiny_model_dir, batch=100000000))
    assert message == (
        "dataset 0 has 2 samples per epoch (images x num_repeats, regularisation images "
        "included) but batch_size = 100000000; set train_batch_size (or datasets[0].batch_size) "
        "to 2 or less, or raise num_repeats"
    )


@pytest.mark.parametrize(
    ("repeats", "reg", "samples"),
    [
        (3, False, 6),  # 2 images x 3 repeats
        (1, True, 4),  # 2 train images, and as many reg samples
    ],
)
def test_repeats_and_reg_images_count_as_samples(
    write_toml, tmp_path, tiny_model_dir, repeats, reg, samples
):
    message = _trainer_error(_config(write_toml, tmp_path, tiny_model_dir, samples + 1, repeats, reg))
    assert message.startswith(f"dataset 0 has {samples} samples per epoch")
    # a batch of exactly the samples passes the check
    reset_accelerate()
    try:
        trainer = Trainer(_config(write_toml, tmp_path, tiny_model_dir, samples, repeats, reg))
    finally:
        reset_accelerate()
    assert trainer.data.stats.datasets[0].samples_per_epoch == samples


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--network_dim", "2000000000"], 'key "network_dim" = 2000000000 is not valid'),
        (["--conv_dim", "8193"], 'key "conv_dim" = 8193 is not valid'),
        (["--network_args", "conv_dim=100000"], 'key "conv_dim" = 100000 is not valid'),
        (["--block_dims", "[4, 9000]"], 'key "block_dims" = [4, 9000] is not valid'),
    ],
)
def test_adapter_ranks_are_bounded_before_anything_is_allocated(write_toml, argv, expected):
    """A rank of 2e9 would allocate 256 GB for one layer's adapter; ranks stop at MAX_RANK."""
    from library.config.adapter_schema import MAX_RANK
    from library.config.cli_args import parse_cli

    path = write_toml("a.toml", HEAD + DATASET)
    message = error_of(path, parse_cli(argv).overrides)
    assert expected in message and f"<= {MAX_RANK}" in message
    assert load_config(path, parse_cli(["--network_dim", str(MAX_RANK)]).overrides)
