"""EMA of the trained weights: the saved average matches an independent computation, and resumes."""

import pytest

from library.training.saver import Saver
from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 3)


def test_ema_file_is_the_moving_average_of_the_steps(tmp_path, tiny_model_dir, images):
    # With a constant schedule, a run of k steps is the first k steps of a longer run.
    weights = []
    for k in (1, 2, 3):
        config = write_config(tmp_path / f"w{k}.toml", tiny_model_dir, images, tmp_path / f"w{k}", max_train_steps=k)
        assert train(config) == 0
        weights.append(tensors(tmp_path / f"w{k}" / "run.safetensors"))
    config = write_config(tmp_path / "e.toml", tiny_model_dir, images, tmp_path / "e", max_train_steps=3, ema_decay=0.5)
    assert train(config) == 0
    assert_close_dicts(tensors(tmp_path / "e" / "run.safetensors"), weights[2], atol=0)  # EMA never touches training

    # diffusers' warm-up: decay_n = min(decay, (1 + n) / (10 + n)) with n = step - 1, and 0 at step 1
    expected = dict(weights[0])
    for step, current in ((2, weights[1]), (3, weights[2])):
        d = min(0.5, step / (9 + step))
        expected = {k: d * expected[k] + (1 - d) * current[k] for k in current}
    ema = tensors(tmp_path / "e" / "run-ema.safetensors")
    trained = {k: v for k, v in expected.items() if not k.endswith(".alpha")}
    assert_close_dicts({k: ema[k] for k in trained}, trained, atol=1e-7)


def test_ema_survives_a_resume(tmp_path, tiny_model_dir, images, monkeypatch):
    keys = dict(max_train_steps=4, ema_decay=0.9, save_every_n_steps=2, save_state=True)
    straight = write_config(tmp_path / "a.toml", tiny_model_dir, images, tmp_path / "a", **keys)
    assert train(straight) == 0
    config = write_config(tmp_path / "b.toml", tiny_model_dir, images, tmp_path / "b", **keys)
    original = Saver.after_step

    def crash_after_step_2(self, global_step):
        original(self, global_step)
        if global_step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(Saver, "after_step", crash_after_step_2)
    assert train(config) == 130
    monkeypatch.setattr(Saver, "after_step", original)
    assert (tmp_path / "b" / "run-step00000002-ema.safetensors").exists()
    assert train(config, "--resume", str(tmp_path / "b" / "run-step00000002-state")) == 0
    assert_close_dicts(tensors(tmp_path / "a" / "run-ema.safetensors"), tensors(tmp_path / "b" / "run-ema.safetensors"), atol=1e-6)
