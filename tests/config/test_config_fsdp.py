"""The fsdp key, kohya's deepspeed / zero_stage that turn into it, and what it cannot go with."""

import pytest

from library.config.loader import load_config
from tests.config.config_helpers import error_of

BASE = 'pretrained_model_name_or_path = "m"\n'
DATASETS = '\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = "images"\n'


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("", "no"),
        ("deepspeed = true", "shard_grad_op"),  # sd-scripts' default stage is 2
        ("deepspeed = true\nzero_stage = 1", "shard_grad_op"),
        ("deepspeed = true\nzero_stage = 3", "full_shard"),
        ("deepspeed = true\nzero_stage = 0", "no"),
        ("deepspeed = false\nzero_stage = 3", "no"),
        ('fsdp = "full_shard"', "full_shard"),
        ('deepspeed = true\nzero_stage = 3\nfsdp = "full_shard"', "full_shard"),
    ],
)
def test_kohya_deepspeed_keys_pick_the_fsdp_mode(write_toml, lines, expected):
    config = load_config(write_toml("a.toml", BASE + lines + DATASETS))
    assert config.training.fsdp == expected


def test_the_translation_and_an_unused_stage_are_announced(write_toml):
    path = write_toml("a.toml", BASE + "deepspeed = true\nzero_stage = 3" + DATASETS)
    (notice,) = load_config(path).notices
    assert notice.startswith(f"{path}: deepspeed = true (zero_stage = 3)")
    assert 'fsdp = "full_shard"' in notice
    path = write_toml("b.toml", BASE + "zero_stage = 3" + DATASETS)
    assert load_config(path).notices == (
        f"{path}: zero_stage is ignored: it only acts with deepspeed = true",
    )


def test_the_command_line_flag_works_too(write_toml):
    path = write_toml("a.toml", BASE + DATASETS)
    config = load_config(path, [("deepspeed", None), ("zero_stage", "3")])
    assert config.training.fsdp == "full_shard"


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        ('deepspeed = true\nfsdp = "full_shard"', ['means fsdp = "shard_grad_op"', "keep one"]),
        ("deepspeed = true\nzero_stage = 4", ["zero_stage = 4", "0, 1, 2 or 3"]),
        ('deepspeed = true\noffload_optimizer_device = "cpu"', ["offload_optimizer_device"]),
        ('offload_param_device = "nvme"', ["offload_param_device", "planned"]),
        ("fp16_master_weights_and_gradients = true", ["fp16_master_weights_and_gradients"]),
        ('fsdp = "full_shard"\nmixed_precision = "fp16"', ['mixed_precision = "bf16"']),
        ('fsdp = "shard_grad_op"\nfp8_base = true', ["fp8_base", 'fsdp = "no"']),
        ('fsdp = "full_shard"\nblocks_to_swap = 2', ["blocks_to_swap = 2", "one of them"]),
        ('fsdp = "zero3"', ["fsdp", "full_shard"]),
        ('fsdp = "full_shard"\noptimizer_type = "Prodigy"', ['"Prodigy"', "AdamW, Lion"]),
        ('deepspeed = true\noptimizer_type = "AdamW8bit"', ['"AdamW8bit"', "whole tensors"]),
    ],
)
def test_what_cannot_be_sharded_stops_with_the_key(write_toml, lines, words):
    path = write_toml("a.toml", BASE + lines + DATASETS)
    message = error_of(path)
    assert path in message
    for word in words:
        assert word in message


def test_off_values_of_the_offload_keys_load(write_toml):
    lines = 'deepspeed = true\noffload_optimizer_device = ""\noffload_param_device = "none"'
    assert (
        load_config(write_toml("a.toml", BASE + lines + DATASETS)).training.fsdp == "shard_grad_op"
    )
