"""Issue-5 data features end to end on the tiny models: caches, buckets, validation, bad data."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from PIL import Image
from safetensors import safe_open
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4)


def _config(tmp_path, model, images, name, **keys):
    keys.setdefault("train_batch_size", 2)
    keys.setdefault("max_train_steps", 3)
    return write_config(tmp_path / f"{name}.toml", model, images, tmp_path / name, **keys)


def _weights(tmp_path, name):
    return tensors(tmp_path / name / "run.safetensors")


def test_latent_cache_trains_like_encoding_every_step(tmp_path, tiny_model_dir, images, capsys):
    keys = {"flip_aug": True, "cache_dir": str(tmp_path / "cache")}
    assert train(_config(tmp_path, tiny_model_dir, images, "plain", **keys)) == 0
    assert train(_config(tmp_path, tiny_model_dir, images, "mem", cache_latents=True, **keys)) == 0
    disk = _config(tmp_path, tiny_model_dir, images, "disk", cache_latents_to_disk=True, **keys)
    assert train(disk) == 0
    assert "8 entries, 0 found cached, 8 encoded" in capsys.readouterr().out  # 4 images x 2 sides
    plain = _weights(tmp_path, "plain")
    # The cache keeps the posterior (mean, std), and the latent sample stays keyed per sample:
    # the runs differ only by the rounding of VAE batches of another size.
    assert_close_dicts(_weights(tmp_path, "mem"), plain, atol=5e-5)
    assert_close_dicts(_weights(tmp_path, "disk"), plain, atol=5e-5)
    assert train(disk, "--overwrite") == 0
    assert "8 entries, 8 found cached, 0 encoded" in capsys.readouterr().out
    assert_close_dicts(_weights(tmp_path, "disk"), plain, atol=5e-5)
    # editing one image re-encodes exactly that image (both sides); a new resolution, everything
    edited = tmp_path / "edited"
    shutil.copytree(images, edited)
    Image.new("RGB", (64, 64), (1, 2, 3)).save(edited / "img02.png")
    again = write_config(
        tmp_path / "e.toml", tiny_model_dir, edited, tmp_path / "e", cache_latents_to_disk=True,
        train_batch_size=2, max_train_steps=1, **keys,
    )  # fmt: skip
    assert train(again) == 0
    assert "8 entries, 6 found cached, 2 encoded" in capsys.readouterr().out
    bigger = write_config(
        tmp_path / "r.toml", tiny_model_dir, edited, tmp_path / "r", cache_latents_to_disk=True,
        train_batch_size=2, max_train_steps=1, resolution=128, **keys,
    )  # fmt: skip
    assert train(bigger) == 0
    assert "8 entries, 0 found cached, 8 encoded" in capsys.readouterr().out
    # guard: the tolerance tells runs apart (the same run without flips is far off)
    keys["flip_aug"] = False
    assert train(_config(tmp_path, tiny_model_dir, images, "noflip", **keys)) == 0
    noflip = _weights(tmp_path, "noflip")
    assert max((noflip[k] - plain[k]).abs().max().item() for k in plain) > 1e-3


def test_text_cache_with_shuffled_captions_trains_like_encoding_every_step(
    tmp_path, tiny_model_dir, images
):
    keys = {
        "network_train_unet_only": True,
        "shuffle_caption": True,
        "caption_dropout_rate": 0.3,
        "caption_separator": " ",
        "cache_dir": str(tmp_path / "cache"),
    }
    assert train(_config(tmp_path, tiny_model_dir, images, "plain", **keys)) == 0
    cached = _config(
        tmp_path, tiny_model_dir, images, "te", cache_text_encoder_outputs_to_disk=True, **keys
    )
    assert train(cached) == 0
    assert_close_dicts(_weights(tmp_path, "te"), _weights(tmp_path, "plain"), atol=1e-6)
    assert list((tmp_path / "cache" / "text").glob("*.safetensors"))


def _mixed_images(folder):
    folder.mkdir(parents=True)
    for i, size in enumerate([(64, 64), (64, 128), (128, 64), (96, 96), (60, 130)]):
        Image.new("RGB", size, (40 * i, 200 - 30 * i, 90)).save(folder / f"m{i}.png")
        (folder / f"m{i}.txt").write_text(f"mixed image {i}")
    return folder


def _scalars(logdir):
    runs = list(logdir.rglob("events.out.tfevents.*"))
    accumulator = EventAccumulator(str(runs[0].parent))
    accumulator.Reload()
    return {
        t: [(e.step, e.value) for e in accumulator.Scalars(t)]
        for t in accumulator.Tags()["scalars"]
    }


def test_buckets_and_validation_loss_in_a_run(tmp_path, tiny_model_dir, capsys):
    folder = _mixed_images(tmp_path / "mixed")
    logdir = tmp_path / "logs"
    keys = dict(
        resolution=96,
        enable_bucket=True,
        min_bucket_reso=64,
        max_bucket_reso=192,
        validation_split=0.2,
        validate_every_n_steps=2,
        train_batch_size=1,
        max_train_steps=4,
        log_with="tensorboard",
        logging_dir=str(logdir),
    )
    config = write_config(tmp_path / "b.toml", tiny_model_dir, folder, tmp_path / "b", **keys)
    assert train(config, "--dry_run") == 0
    plan = capsys.readouterr().out
    assert re.search(r"\d buckets \(width x height", plan) and "1 images held out" in plan
    assert train(config) == 0
    scalars = _scalars(logdir)
    assert [s for s, _ in scalars["loss/validation"]] == [2, 4]
    with safe_open(str(tmp_path / "b" / "run.safetensors"), "pt") as handle:
        metadata = handle.metadata()
    assert metadata["ss_enable_bucket"] == "True"
    buckets = json.loads(metadata["ss_bucket_info"])["buckets"]
    assert sum(b["count"] for b in buckets.values()) == 4  # 5 images, 1 held out, 1 repeat
    assert all(w % 64 == 0 and h % 64 == 0 for w, h in (b["resolution"] for b in buckets.values()))


def test_bad_image_stops_before_training_or_is_skipped(tmp_path, tiny_model_dir, capsys):
    folder = make_images(tmp_path / "bad_images", 3)
    (folder / "img01.png").write_bytes(b"not a png")
    config = _config(tmp_path, tiny_model_dir, folder, "bad", max_train_steps=1)
    assert train(config) == 2
    err = capsys.readouterr().err
    assert "img01.png cannot be read" in err and "skip_bad_images = true" in err
    assert train(config, "--skip_bad_images") == 0
    out = capsys.readouterr().out
    assert "warning: 1 unreadable images left out" in out and "img01.png" in out


def test_alpha_mask_long_captions_and_metadata_file(tmp_path, tiny_model_dir, monkeypatch):
    from library.sampling import generate

    seen = []
    real = generate.encode_conditioning

    def recording(*args, **kwargs):
        cond = real(*args, **kwargs)
        seen.append(cond.encoder_hidden_states.shape[1])
        return cond

    monkeypatch.setattr(generate, "encode_conditioning", recording)
    folder = tmp_path / "alpha"
    folder.mkdir()
    lines = []
    for i in range(2):
        image = Image.new("RGBA", (64, 64), (200, 30 * i, 40, 255))
        image.paste((0, 0, 0, 0), (0, 0, 32, 64))  # left half transparent
        image.save(folder / f"a{i}.png")
        lines.append(json.dumps({"file_name": f"a{i}.png", "text": " ".join(["word"] * 90)}))
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    dataset = tmp_path / "dataset.toml"
    dataset.write_text(
        "[[datasets]]\nresolution = 64\nbatch_size = 2\n[[datasets.subsets]]\n"
        f'metadata_file = "{folder / "metadata.jsonl"}"\nalpha_mask = true\n'
    )
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(" ".join(["word"] * 100) + " --w 64 --h 64 --s 2\n")
    config = tmp_path / "c.toml"
    config.write_text(
        f'pretrained_model_name_or_path = "{tiny_model_dir}"\noutput_dir = "{tmp_path / "out"}"\n'
        f'dataset_config = "{dataset}"\nmax_train_steps = 1\nmax_token_length = 150\n'
        f'network_dim = 4\nsample_prompts = "{prompts}"\nsample_every_n_steps = 1\n'
    )
    assert train(config) == 0
    assert (tmp_path / "out" / "last.safetensors").is_file()
    assert list((tmp_path / "out" / "sample").glob("*.png"))
    assert seen and set(seen) == {152}  # samples are prompted like the captions were trained
