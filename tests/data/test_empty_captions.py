"""Images without a caption file and without class_tokens train with the empty caption."""

from __future__ import annotations

import pytest
from data_helpers import index_color, write_image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.captions import CaptionOptions, process_caption
from library.data.dataset import TrainData
from library.data.folders import scan_subset
from library.data.plan import plan_lines

UNCAPTIONED_LINE = (
    "  {n} images have no caption file and no class_tokens: trained with an empty caption "
    "(unconditional)"
)


def _folder(tmp_path, captions):
    """Images 0.png, 1.png, ...; a caption file for each caption that is not None."""
    folder = tmp_path / "3"
    for i, caption in enumerate(captions):
        write_image(folder / f"{i}.png", index_color(i), size=(32, 32))
        if caption is not None:
            (folder / f"{i}.txt").write_text(caption)
    return folder


def test_scanned_items_have_the_empty_caption(tmp_path):
    folder = _folder(tmp_path, ["a cat", None, None])
    items = scan_subset(SubsetConfig(image_dir=str(folder)))
    assert [(item.path.name, item.caption) for item in items] == [
        ("0.png", "a cat"),
        ("1.png", ""),
        ("2.png", ""),
    ]


def test_the_plan_counts_them_and_class_tokens_remove_them(tmp_path):
    folder = _folder(tmp_path, ["a cat", None, None, "a dog", None])
    config = DatasetConfig(resolution=64, subsets=[SubsetConfig(image_dir=str(folder))])
    data = TrainData([config], seed=0)
    assert data.stats.datasets[0].uncaptioned_images == 3
    assert UNCAPTIONED_LINE.format(n=3) in plan_lines(data)

    tokens = SubsetConfig(image_dir=str(folder), class_tokens="sks")
    data = TrainData([DatasetConfig(resolution=64, subsets=[tokens])], seed=0)
    assert data.stats.datasets[0].uncaptioned_images == 0
    assert not any("no caption file" in line for line in plan_lines(data))


def test_held_out_images_without_captions_are_counted_too(tmp_path):
    folder = _folder(tmp_path, [None] * 10)
    subset = SubsetConfig(image_dir=str(folder))
    data = TrainData([DatasetConfig(resolution=64, validation_split=0.2, subsets=[subset])], 0)
    assert data.num_validation_images == 2
    assert UNCAPTIONED_LINE.format(n=10) in plan_lines(data)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"shuffle_caption": True, "keep_tokens": 2},
        {"keep_tokens_separator": "|||", "shuffle_caption": True},
        {"secondary_separator": ";;;"},
        {"caption_tag_dropout_rate": 0.5},
        {"token_warmup_step": 10, "token_warmup_min": 1},
        {"enable_wildcard": True},
        {"caption_dropout_rate": 0.5},
    ],
    ids=lambda options: ",".join(options) or "default",
)
@pytest.mark.parametrize(("prefix", "suffix"), [("", ""), ("sks dog, ", ", best quality")])
def test_caption_operations_on_the_empty_caption(options, prefix, suffix):
    caption_options = CaptionOptions(caption_prefix=prefix, caption_suffix=suffix, **options)
    for epoch in range(3):
        for position in range(8):
            result = process_caption(
                "", caption_options, seed=1, epoch=epoch, position=position, global_step=3,
                max_train_steps=20,
            )  # fmt: skip
            # Nothing but the prefix and suffix can appear; dropout empties those too.
            assert result in (prefix + suffix, "")
            if "caption_dropout_rate" not in options:
                assert result == prefix + suffix


def test_the_loader_gives_prefix_and_suffix_as_the_caption(tmp_path):
    folder = _folder(tmp_path, ["a cat", None, None])
    subset = SubsetConfig(
        image_dir=str(folder),
        caption_prefix="sks, ",
        caption_suffix=", photo",
        shuffle_caption=True,
    )
    data = TrainData([DatasetConfig(resolution=64, batch_size=3, subsets=[subset])], seed=0)
    [batch] = list(data.loader(epoch=0, rank=0))
    assert sorted(batch["captions"]) == ["sks, , photo", "sks, , photo", "sks, a cat, photo"]


def test_captions_with_the_other_common_extension_are_not_silently_skipped(tmp_path):
    # kohya's default caption_extension is ".caption", difftune's ".txt": a folder captioned for
    # one must not train uncaptioned under the other
    from PIL import Image

    from library.errors import DataError

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "a.caption").write_text("a photo", encoding="utf-8")
    with pytest.raises(DataError, match='set caption_extension = ".caption"'):
        scan_subset(SubsetConfig(image_dir=str(tmp_path)))
    items = scan_subset(SubsetConfig(image_dir=str(tmp_path), caption_extension=".caption"))
    assert [item.caption for item in items] == ["a photo"]
