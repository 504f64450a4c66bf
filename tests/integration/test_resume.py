"""A run stopped after k steps and resumed ends on the same weights as an uninterrupted run."""

import json

import pytest

from library.training.saver import Saver
from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 3)


@pytest.mark.parametrize(
    "mode", [{}, {"train_mode": "unet", "learning_rate": 1e-4}], ids=["lora", "full-unet"]
)
def test_resume_matches_uninterrupted(tmp_path, tiny_model_dir, images, mode, monkeypatch):
    # 3 images, batch 2 -> 2 steps per epoch (last one padded); 5 steps cross two epoch ends
    keys = dict(
        train_batch_size=2, max_train_steps=5, lr_scheduler="cosine", lr_warmup_steps=1,
        max_grad_norm=1.0, **mode,
    )
    straight = write_config(tmp_path / "a.toml", tiny_model_dir, images, tmp_path / "a", **keys)
    assert train(straight) == 0

    first = write_config(
        tmp_path / "b.toml", tiny_model_dir, images, tmp_path / "b",
        save_every_n_steps=3, save_state=True, **keys,
    )
    original = Saver.after_step

    def crash_after_step_3(self, global_step):
        original(self, global_step)
        if global_step == 3:
            raise KeyboardInterrupt  # the run is stopped right after its step-3 save

    monkeypatch.setattr(Saver, "after_step", crash_after_step_3)
    assert train(first) == 130
    monkeypatch.setattr(Saver, "after_step", original)
    assert not (tmp_path / "b" / "run.safetensors").exists()
    state = tmp_path / "b" / "run-step00000003-state"
    assert json.loads((state / "progress.json").read_text())["global_step"] == 3
    assert train(first, "--resume", str(state)) == 0

    a, b = tensors(tmp_path / "a" / "run.safetensors"), tensors(tmp_path / "b" / "run.safetensors")
    assert_close_dicts(a, b, atol=1e-6)


def test_resume_refuses_a_different_effective_batch(tmp_path, tiny_model_dir, images, capsys):
    config = write_config(
        tmp_path / "c.toml", tiny_model_dir, images, tmp_path / "c",
        max_train_steps=2, save_state_on_train_end=True,
    )
    assert train(config) == 0
    state = str(tmp_path / "c" / "run-state")
    code = train(config, "--resume", state, "--gradient_accumulation_steps", "2", "--max_train_steps", "4")
    assert code == 2
    assert "effective_batch_sizes" in capsys.readouterr().err


def test_missing_start_files_are_named_before_anything_loads(tmp_path, tiny_model_dir, images, capsys, monkeypatch):
    def no_model_loading(*args, **kwargs):
        raise AssertionError("models were loaded before the inputs were checked")

    monkeypatch.setattr("library.training.trainer.load_components", no_model_loading)
    config = write_config(tmp_path / "d.toml", tiny_model_dir, images, tmp_path / "d", max_train_steps=1)
    assert train(config, "--resume", str(tmp_path / "nowhere")) == 2
    assert "nowhere does not exist; give a *-state folder" in capsys.readouterr().err
    assert train(config, "--network_weights", str(tmp_path / "none.safetensors")) == 2
    assert "none.safetensors does not exist" in capsys.readouterr().err
