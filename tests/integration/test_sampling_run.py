"""Sampling during training writes the expected images and never changes the trained weights."""

from PIL import Image

from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config


def test_sampling_leaves_training_untouched(tmp_path, tiny_model_dir):
    images = make_images(tmp_path / "imgs", 3)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "# two prompts, one with its own size and seed\n"
        "a red circle --w 64 --h 64 --s 2 --d 5\n"
        "a blue square --n blurry --w 96 --h 64 --s 2 --l 5 --ss euler_a\n",
        encoding="utf-8",
    )
    keys = dict(train_batch_size=1, max_train_steps=4, lr_scheduler="cosine", ip_noise_gamma=0.1)
    plain = write_config(tmp_path / "plain.toml", tiny_model_dir, images, tmp_path / "plain", **keys)
    assert train(plain) == 0
    sampled = write_config(
        tmp_path / "s.toml", tiny_model_dir, images, tmp_path / "s",
        sample_prompts=str(prompts), sample_every_n_steps=2, sample_at_first=True, **keys,
    )
    assert train(sampled) == 0
    assert_close_dicts(tensors(tmp_path / "plain" / "run.safetensors"), tensors(tmp_path / "s" / "run.safetensors"), atol=0)

    sample_dir = tmp_path / "s" / "sample"
    names = sorted(p.name for p in sample_dir.iterdir())
    for step in (0, 2, 4):
        assert f"run_{step:06d}_grid.png" in names
        assert any(n.startswith(f"run_{step:06d}_00_") for n in names)
        assert any(n.startswith(f"run_{step:06d}_01_") for n in names)
    first = next(sample_dir.glob("run_000002_00_*.png"))
    second = next(sample_dir.glob("run_000002_01_*.png"))
    assert Image.open(first).size == (64, 64) and Image.open(second).size == (96, 64)
    # training moved the adapter, so the same prompt and seed give another image at step 4
    later = next(sample_dir.glob("run_000004_00_*.png"))
    assert Image.open(first).tobytes() != Image.open(later).tobytes()
