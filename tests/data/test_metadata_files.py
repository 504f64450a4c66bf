from __future__ import annotations

import json

import pytest
from data_helpers import write_image

from library.data.metadata_files import MetadataEntry, read_metadata_entries
from library.errors import DataError


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_kohya_json_captions_tags_and_lookup(tmp_path):
    images = tmp_path / "images"
    write_image(images / "b.png")
    write_image(images / "a.jpg")
    write_image(images / "c.webp")
    write_image(images / "c.png")  # .png is looked up before .webp
    write_image(images / "sub" / "d.JPEG")
    metadata = write_json(
        tmp_path / "meta" / "meta.json",
        {
            "b.png": {"caption": " a dog \n a cat ", "tags": "grass, sky"},
            "a": {"tags": "solo"},
            "c": {"caption": "photo", "tags": ""},
            "sub/d": {"caption": "deep", "tags": None, "train_resolution": [512, 512]},
        },
    )

    entries = read_metadata_entries(metadata, images)

    assert entries == [
        MetadataEntry(images / "a.jpg", "solo"),
        MetadataEntry(images / "b.png", "a dog \n a cat, grass, sky"),
        MetadataEntry(images / "c.png", "photo"),
        MetadataEntry(images / "sub" / "d.JPEG", "deep"),
    ]


def test_kohya_json_paths_default_to_its_folder_and_absolute_keys(tmp_path):
    write_image(tmp_path / "a.png")
    elsewhere = write_image(tmp_path / "other" / "b.bmp")
    metadata = write_json(
        tmp_path / "meta.json",
        {"a": {"caption": "x"}, str(elsewhere.with_suffix("")): {"caption": "y"}},
    )
    assert read_metadata_entries(str(metadata), None) == [
        MetadataEntry(tmp_path / "a.png", "x"),
        MetadataEntry(elsewhere, "y"),
    ]


def test_jsonl_imagefolder(tmp_path):
    write_image(tmp_path / "train" / "z.png")
    write_image(tmp_path / "train" / "sub" / "y.jpg")
    lines = [
        json.dumps({"file_name": "z.png", "text": "zed", "caption": "ignored"}),
        "",
        json.dumps({"file_name": "sub/y.jpg", "caption": "why\u2028not"}),
    ]
    metadata = tmp_path / "train" / "metadata.jsonl"
    metadata.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    assert read_metadata_entries(metadata, None) == [
        MetadataEntry(tmp_path / "train" / "sub" / "y.jpg", "why\u2028not"),
        MetadataEntry(tmp_path / "train" / "z.png", "zed"),
    ]


def test_csv_imagefolder_with_image_dir(tmp_path):
    images = tmp_path / "pics"
    write_image(images / "b.png")
    write_image(images / "a.webp")
    metadata = tmp_path / "meta" / "metadata.CSV"
    metadata.parent.mkdir()
    text = 'file_name,text,extra\nb.png,"bee, with comma",1\n\na.webp,"multi\nline",2\n'
    metadata.write_bytes(b"\xef\xbb\xbf" + text.encode())  # Excel writes a BOM
    assert read_metadata_entries(metadata, images) == [
        MetadataEntry(images / "a.webp", "multi\nline"),
        MetadataEntry(images / "b.png", "bee, with comma"),
    ]


def test_csv_caption_column(tmp_path):
    write_image(tmp_path / "a.png")
    (tmp_path / "m.csv").write_text("caption,file_name\nhello,a.png\n")
    assert read_metadata_entries(tmp_path / "m.csv", None) == [
        MetadataEntry(tmp_path / "a.png", "hello")
    ]


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("m.json", '{"a": {"caption": "x"},\n "b": }', r"m\.json is not valid JSON .*line 2"),
        ("m.json", '{"a": {"caption": "x"}, "a": {"caption": "y"}}', 'key "a" twice'),
        ("m.json", '["a.png"]', "must hold a JSON object"),
        ("m.json", "{}", "lists no images"),
        ("m.json", '{"a": "x"}', 'entry "a" must be an object'),
        ("m.json", '{"a": {"tags": " "}}', 'entry "a" has no "caption" or "tags"'),
        ("m.json", '{"a": {"caption": 3}}', '"caption" must be a string'),
        ("m.json", '{"a.png": {"caption": "x"}, "a": {"caption": "y"}}', "a.png twice"),
        ("m.json", '{"gone": {"caption": "x"}}', r'entry "gone": no image .*gone\{\.png'),
        ("m.json", '{"gone.jpg": {"caption": "x"}}', r"image .*gone\.jpg does not exist"),
        ("m.jsonl", '{"file_name": "a.png", "text": "x"}\n\n{"file_name": ', "line 3 is not"),
        ("m.jsonl", '{"file_name": "a.png"}', r"line 1 has no \"text\".*found: file_name"),
        (
            "m.jsonl",
            '{"text": "x", "n": 1}',
            r'line 1 names no image: add "image_path" .*"file_name".*found: text, n',
        ),
        # a musubi-tuner row without its image is asked for musubi-tuner's key first
        (
            "m.jsonl",
            '{"caption": "x", "control_path": "a.png"}',
            r'line 1 names no image: add "image_path" \(musubi-tuner',
        ),
        ("m.jsonl", '{"file_name": "a.png", "text": ""}', 'line 1 has an empty "text"'),
        ("m.jsonl", '"a.png"', "line 1 must be a JSON object"),
        ("m.jsonl", "\n\n", "lists no images"),
        ("m.jsonl", '{"file_name": "b.png", "text": "x"}', r"line 1: image .*b\.png does not"),
        ("m.jsonl", '{"file_name": "a.psd", "text": "x"}', r"line 1: a\.psd is not a training"),
        ("m.csv", "file_name,tags\na.png,x\n", r"line 2 has no \"text\".*file_name, tags"),
        ("m.csv", "file_name,text\na.png,x,extra\n", "line 2 has more cells"),
        ("m.csv", "file_name,text\na.png\n", 'line 2 has an empty "text"'),
        ("m.csv", "file_name,text\na.png,x\n./a.png,y\n", r"twice \(line 2 and line 3\)"),
        ("m.csv", "file_name,text\n", "lists no images"),
        ("m.csv", "", "lists no images"),
        ("m.txt", "a.png x", "unknown extension"),
    ],
)
def test_errors_name_file_and_entry(tmp_path, name, content, pattern):
    write_image(tmp_path / "a.png")
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=pattern) as error:
        read_metadata_entries(tmp_path / name, None)
    assert str(tmp_path / name) in str(error.value)
    assert "\n" not in str(error.value)


def test_unreadable_files_and_folders(tmp_path):
    with pytest.raises(DataError, match="missing.json does not exist"):
        read_metadata_entries(tmp_path / "missing.json", None)
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(DataError, match="folder.jsonl is a folder"):
        read_metadata_entries(tmp_path / "folder.jsonl", None)
    (tmp_path / "latin.csv").write_bytes("file_name,text\na.png,caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.csv is not UTF-8 .*byte 24"):
        read_metadata_entries(tmp_path / "latin.csv", None)
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")  # would be read forever
    with pytest.raises(DataError, match=r"zero\.jsonl is not a regular file .*fix metadata_file"):
        read_metadata_entries(tmp_path / "zero.jsonl", None)
    write_json(tmp_path / "m.json", {"a": {"caption": "x"}})
    with pytest.raises(
        DataError, match=r"image_dir .*nowhere \(for metadata file .*m\.json\) does not exist"
    ):
        read_metadata_entries(tmp_path / "m.json", tmp_path / "nowhere")
