"""Settings sd-scripts warns about and then ignores or adjusts load here with the same warning,
meaning what sd-scripts makes of them, instead of being refused."""

from __future__ import annotations

import pytest
from PIL import Image

from library.config.loader import load_config
from library.errors import DataError

HEAD = 'pretrained_model_name_or_path = "m"\n'


def _images(folder, count=2):
    folder.mkdir(parents=True)
    for i in range(count):
        Image.new("RGB", (64, 64), (90 * i, 20, 20)).save(folder / f"{i}.png")
    return folder


def _dataset(folder, extra: str = "") -> str:
    return f"[[datasets]]\n{extra}[[datasets.subsets]]\nimage_dir = '{folder}'\n"


def test_split_mode_means_kohyas_18_swapped_blocks(write_toml, tmp_path):
    data = _dataset(_images(tmp_path / "img"))
    config = load_config(write_toml("a.toml", HEAD + "split_mode = true\n" + data))
    assert config.training.blocks_to_swap == 18
    assert any("split_mode = true means blocks_to_swap = 18" in n for n in config.notices)
    # with blocks_to_swap given, sd-scripts ignores split_mode
    config = load_config(
        write_toml("b.toml", HEAD + "split_mode = true\nblocks_to_swap = 4\n" + data)
    )
    assert config.training.blocks_to_swap == 4
    assert any("split_mode is ignored because blocks_to_swap is set" in n for n in config.notices)
    off = load_config(write_toml("c.toml", HEAD + "split_mode = false\n" + data))
    assert off.training.blocks_to_swap == 0 and not off.notices


@pytest.mark.parametrize("key", ["sample_every_n_steps", "sample_every_n_epochs"])
def test_a_negative_sample_cadence_turns_sampling_off(write_toml, tmp_path, key):
    data = _dataset(_images(tmp_path / "img"))
    config = load_config(write_toml("a.toml", HEAD + f"{key} = -1\n" + data))
    assert getattr(config.sampling, key) is None
    assert any(f"{key} = -1 turns sampling off" in n for n in config.notices)


def test_a_subset_with_num_repeats_0_is_left_out(write_toml, tmp_path):
    used, unused = _images(tmp_path / "used"), _images(tmp_path / "unused")
    text = HEAD + _dataset(used) + f"[[datasets.subsets]]\nimage_dir = '{unused}'\nnum_repeats = 0\n"
    config = load_config(write_toml("a.toml", text))
    assert [s.image_dir for s in config.datasets[0].subsets] == [str(used)]
    assert any("subsets[1]" in n and "num_repeats = 0" in n for n in config.notices)
    # a dataset with nothing left to train is refused, naming it
    only = HEAD + "[[datasets]]\n" + f"[[datasets.subsets]]\nimage_dir = '{unused}'\nnum_repeats = 0\n"
    with pytest.raises(Exception, match=r"datasets\[0\] has no subset left to train"):
        load_config(write_toml("b.toml", only))


def test_train_data_dir_folders_without_repeats_are_left_out(write_toml, tmp_path):
    train = tmp_path / "train"
    _images(train / "3_dog")
    _images(train / "backup")  # no repeat count: sd-scripts warns and leaves it out
    _images(train / "0_cat")  # 0 repeats: the same
    config = load_config(write_toml("a.toml", HEAD + f"train_data_dir = '{train}'\n"))
    assert [s.image_dir for s in config.datasets[0].subsets] == [str(train / "3_dog")]
    notes = " ".join(config.notices)
    assert '"backup" is left out: no repeat count' in notes and '"0_cat" is left out: 0 repeats' in notes
    # no usable folder at all: still an error naming the folder
    alone = tmp_path / "alone"
    _images(alone / "backup")
    with pytest.raises(DataError, match="backup has no repeat count"):
        load_config(write_toml("b.toml", HEAD + f"train_data_dir = '{alone}'\n"))


def test_bucket_limits_are_rounded_to_bucket_reso_steps(write_toml, tmp_path):
    folder = _images(tmp_path / "img")
    buckets = "enable_bucket = true\nresolution = 512\nmin_bucket_reso = 300\nmax_bucket_reso = 1000\n"
    config = load_config(write_toml("a.toml", HEAD + _dataset(folder, buckets)))
    dataset = config.datasets[0]
    # sd-scripts: min rounded down, max rounded up to multiples of the step (64)
    assert (dataset.min_bucket_reso, dataset.max_bucket_reso) == (256, 1024)
    notes = " ".join(config.notices)
    assert "min_bucket_reso = 300 is rounded to 256" in notes
    assert "max_bucket_reso = 1000 is rounded to 1024" in notes
    # without buckets the limits are unused: nothing changes, nothing is said
    plain = load_config(write_toml("b.toml", HEAD + _dataset(folder, buckets.replace("true", "false"))))
    assert plain.datasets[0].min_bucket_reso == 300 and not plain.notices
