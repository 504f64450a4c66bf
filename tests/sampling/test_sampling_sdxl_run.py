"""A short SDXL LoRA run with sampling writes its images and trains exactly as one without."""

from __future__ import annotations

import pytest
from PIL import Image

from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config


@pytest.mark.integration
def test_sdxl_sampling_leaves_training_untouched(tmp_path, tiny_sdxl_model_dir):
    images = make_images(tmp_path / "imgs", 2)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "a red circle --w 64 --h 64 --s 2 --d 5\n"
        "a blue square --n blurry --w 64 --h 64 --s 2 --d 6 --ss euler_a\n",
        encoding="utf-8",
    )
    # Both text encoders train too (SDXL LoRA's default), so the sampled ones are live adapters.
    keys = dict(max_train_steps=2, learning_rate=1e-2)
    plain = write_config(tmp_path / "p.toml", tiny_sdxl_model_dir, images, tmp_path / "p", **keys)
    assert train(plain) == 0
    sampled = write_config(
        tmp_path / "s.toml", tiny_sdxl_model_dir, images, tmp_path / "s",
        sample_prompts=str(prompts), sample_every_n_steps=1, sample_at_first=True, **keys,
    )  # fmt: skip
    assert train(sampled) == 0
    weights = tensors(tmp_path / "s" / "run.safetensors")
    assert any(k.startswith("lora_te2_") for k in weights)
    assert_close_dicts(tensors(tmp_path / "p" / "run.safetensors"), weights, atol=0)

    folder = tmp_path / "s" / "sample"
    expected = [f"run_{s:06d}_{name}.png" for s in (0, 1, 2) for name in ("00_5", "01_6", "grid")]
    assert sorted(p.name for p in folder.iterdir()) == sorted(expected)
    for name in expected:
        size = (128, 64) if name.endswith("grid.png") else (64, 64)
        assert Image.open(folder / name).size == size
    # Training moved the adapters, so the same prompt and seed give another image.
    first, last = (Image.open(folder / f"run_{s:06d}_00_5.png").tobytes() for s in (0, 2))
    assert first != last
