"""The issue-5 data keys: flat dataset defaults, caches, buckets, metadata, validation cadence."""

from __future__ import annotations

import pytest

from library.config.cli_args import parse_cli
from library.config.loader import load_config
from tests.config.config_helpers import error_of

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'



def test_flat_dataset_keys_are_defaults_with_kohya_precedence(write_toml):
    text = (
        HEAD
        + "shuffle_caption = true\nkeep_tokens = 1\nenable_bucket = true\nflip_aug = true\n"
        + "[general]\nkeep_tokens = 2\n"
        + "[[datasets]]\nbucket_reso_steps = 32\n"
        + "[[datasets.subsets]]\nimage_dir = 'a'\n"
        + "[[datasets.subsets]]\nimage_dir = 'b'\nkeep_tokens = 3\nflip_aug = false\n"
    )
    cfg = load_config(write_toml("a.toml", text))
    dataset = cfg.datasets[0]
    assert dataset.enable_bucket and dataset.bucket_reso_steps == 32
    a, b = dataset.subsets
    assert (a.shuffle_caption, a.keep_tokens, a.flip_aug) == (True, 2, True)  # [general] > flat
    assert (b.shuffle_caption, b.keep_tokens, b.flip_aug) == (True, 3, False)  # subset wins


def test_flat_dataset_defaults_on_the_command_line(write_toml):
    path = write_toml("a.toml", HEAD + DATASET)
    overrides = parse_cli(["--shuffle_caption", "--caption_dropout_rate", "0.25"]).overrides
    subset = load_config(path, overrides).datasets[0].subsets[0]
    assert subset.shuffle_caption is True and subset.caption_dropout_rate == 0.25
    assert '"caption_dropout_rate" = 2 is not valid' in error_of(
        path, parse_cli(["--caption_dropout_rate", "2"]).overrides
    )


def test_per_folder_keys_stay_out_of_the_flat_namespace(write_toml):
    path = write_toml("a.toml", HEAD + 'metadata_file = "m.json"\n' + DATASET)
    assert '"metadata_file" is a dataset key' in error_of(path)


def test_latent_cache_refuses_per_epoch_augmentation(write_toml):
    path = write_toml("a.toml", HEAD + "cache_latents = true\nrandom_crop = true\n" + DATASET)
    message = error_of(path)
    assert "random_crop (datasets[0].subsets[0])" in message and "cache_latents" in message
    ok = write_toml("b.toml", HEAD + "cache_latents_to_disk = true\nflip_aug = true\n" + DATASET)
    cfg = load_config(ok)
    assert cfg.data.latents_cached and cfg.datasets[0].subsets[0].flip_aug


def test_text_cache_needs_frozen_text_encoders(write_toml):
    """Unset, network_train_unet_only follows the cache (a default is never refused); written
    false, it is refused with the fix."""
    from library.config.provenance import DEFAULT, provenance

    for key in ("cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk"):
        cfg = load_config(write_toml(f"{key}.toml", HEAD + f"{key} = true\n" + DATASET))
        assert cfg.data.text_cached and cfg.network.network_train_unet_only is True
        assert provenance(cfg).source("network_train_unet_only") == DEFAULT
    path = write_toml(
        "a.toml",
        HEAD + "cache_text_encoder_outputs = true\nnetwork_train_unet_only = false\n" + DATASET,
    )
    assert "network_train_unet_only = true" in error_of(path)
    plain = load_config(write_toml("c.toml", HEAD + DATASET))
    assert plain.network.network_train_unet_only is False  # kohya's default without the cache


@pytest.mark.parametrize(
    ("dataset_keys", "expected"),
    [
        ("bucket_reso_steps = 60", "multiple of 8"),
        ("min_bucket_reso = 768\nmax_bucket_reso = 512", "above max_bucket_reso"),
        ("resolution = 1024\nmax_bucket_reso = 768", "within min_bucket_reso"),
    ],
)
def test_bucket_settings_are_checked(write_toml, dataset_keys, expected):
    text = HEAD + f"[[datasets]]\nenable_bucket = true\n{dataset_keys}\n"
    text += "[[datasets.subsets]]\nimage_dir = 'a'\n"
    message = error_of(write_toml("a.toml", text))
    assert "datasets[0]" in message and expected in message


def test_in_json_makes_a_metadata_subset(write_toml):
    path = write_toml(
        "a.toml", HEAD + 'train_data_dir = "imgs"\nin_json = "meta.json"\ndataset_repeats = 3\n'
    )
    (subset,) = load_config(path).datasets[0].subsets
    assert (subset.image_dir, subset.metadata_file, subset.num_repeats) == ("imgs", "meta.json", 3)
    assert "in_json needs train_data_dir" in error_of(
        write_toml("b.toml", HEAD + 'in_json = "m"\n')
    )


def test_validation_cadence_needs_a_split(write_toml):
    path = write_toml("a.toml", HEAD + "validate_every_n_steps = 10\n" + DATASET)
    assert "validate_every_n_steps needs validation_split" in error_of(path)
    ok = write_toml(
        "b.toml", HEAD + "validate_every_n_steps = 10\nvalidation_split = 0.1\n" + DATASET
    )
    assert load_config(ok).datasets[0].validation_split == 0.1
    assert "validation_split" in error_of(
        write_toml("c.toml", HEAD + "validation_split = 1.0\n" + DATASET)
    )


def test_max_token_length_values(write_toml):
    assert (
        load_config(
            write_toml("a.toml", HEAD + "max_token_length = 225\n" + DATASET)
        ).model.max_token_length
        == 225
    )
    assert "max_token_length" in error_of(
        write_toml("b.toml", HEAD + "max_token_length = 100\n" + DATASET)
    )
