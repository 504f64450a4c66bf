"""A run never writes over one of its inputs, --overwrite or not, and the refusal names both and
the fix before any model loads; two output names never share a file. End to end on the tiny
model."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from library.training import step as step_module
from library.training.saver import Saver
from tests.integration.harness import make_images, train, write_config

REPO = Path(__file__).resolve().parents[2]
FIX = "choose another output_dir or output_name"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4)


def _config(tmp_path, model, images, name="c", **keys):
    keys.setdefault("max_train_steps", 2)
    return write_config(tmp_path / f"{name}.toml", model, images, tmp_path / name, **keys)


def _error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(lines) == 1, lines
    return lines[0]


def _no_model_loading(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr("library.training.trainer.load_components", fail)


def test_the_final_file_as_network_weights_is_never_replaced(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    config = _config(tmp_path, tiny_model_dir, images)
    assert train(config) == 0
    final = tmp_path / "c" / "run.safetensors"
    before = final.read_bytes()
    _no_model_loading(monkeypatch)
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert train(config, "--network_weights", str(final), *extra) == 2
        line = _error_line(capsys)
        assert f"network_weights {final} is {final}" in line and FIX in line, line
        assert "--overwrite" not in line  # replacing an input is never the fix
    assert final.read_bytes() == before


def _vae_file(tmp_path) -> Path:
    vae = tmp_path / "vae.safetensors"
    vae.write_bytes(b"the user's vae file")
    (tmp_path / "c").mkdir()
    return vae


def _symlinked_output(tmp_path, model, images):
    vae = _vae_file(tmp_path)
    (tmp_path / "c" / "run.safetensors").symlink_to(vae)  # the entry an atomic write replaces
    config = _config(tmp_path, model, images)
    return config, ["--vae", str(vae)], vae, f"vae {vae} is {tmp_path / 'c' / 'run.safetensors'}"


def _hard_linked_output(tmp_path, model, images):
    vae = _vae_file(tmp_path)
    os.link(vae, tmp_path / "c" / "run-step00000002.safetensors")
    config = _config(tmp_path, model, images)
    return config, ["--vae", str(vae)], vae, "is a hard link of vae"


def _output_inside_the_model(tmp_path, model, images):
    model = shutil.copytree(model, tmp_path / "model")
    inside = tmp_path / "elsewhere" / ".." / "model" / "unet" / "out"  # ".." as written
    config = _config(tmp_path, model, images)
    expected = "lies inside pretrained_model_name_or_path"
    return config, ["--output_dir", str(inside)], model / "unet" / "config.json", expected


def _diffusers_folder_output(tmp_path, model, images):
    # a full fine-tune writes <output_dir>/<output_name>/: here that is the base model folder
    model = shutil.copytree(model, tmp_path / "models" / "base")
    config = _config(tmp_path, model, images, train_mode="unet")
    options = ["--output_dir", str(model.parent), "--output_name", "base"]
    expected = f'pretrained_model_name_or_path {model} is {model}, an output of output_name "base"'
    return config, options, model / "model_index.json", expected


def _output_inside_the_images(tmp_path, model, images):
    own = make_images(tmp_path / "own_images", 2)
    config = write_config(tmp_path / "c.toml", model, own, own / "out", max_train_steps=2)
    return config, [], own / "img00.png", "lies inside datasets[0].subsets[0].image_dir"


def _samples_into_the_images(tmp_path, model, images):
    # output_dir/sample is a link to the training images: every sample would join them
    own = make_images(tmp_path / "own_images", 2)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a shape\n", encoding="utf-8")
    out = tmp_path / "c"
    out.mkdir()
    (out / "sample").symlink_to(own, target_is_directory=True)
    config = write_config(tmp_path / "c.toml", model, own, out, max_train_steps=2,
                          sample_prompts=str(prompts), sample_every_n_steps=1)  # fmt: skip
    expected = f"the sample folder {out / 'sample'} lies inside datasets[0].subsets[0].image_dir"
    return config, [], own / "img00.png", expected


@pytest.mark.parametrize(
    "case",
    [
        _symlinked_output,
        _hard_linked_output,
        _output_inside_the_model,
        _diffusers_folder_output,
        _output_inside_the_images,
        _samples_into_the_images,
    ],
)
def test_inputs_are_refused_as_outputs_before_models_load(
    case, tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    config, options, watched, expected = case(tmp_path, tiny_model_dir, images)
    before = watched.read_bytes()
    _no_model_loading(monkeypatch)
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert train(config, *options, *extra) == 2
        line = _error_line(capsys)
        assert expected in line and FIX in line and "--overwrite" not in line, line
    assert watched.read_bytes() == before


def test_a_resume_may_not_replace_its_state_with_its_final_state(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    config = _config(tmp_path, tiny_model_dir, images, save_state_on_train_end=True)
    assert train(config) == 0
    state = tmp_path / "c" / "run-state"
    progress = (state / "progress.json").read_bytes()
    capsys.readouterr()
    assert train(config, "--resume", str(state), "--max_train_steps", "4") == 2
    line = _error_line(capsys)
    assert f"resume {state} is {state}" in line and FIX in line, line
    assert (state / "progress.json").read_bytes() == progress
    # without a final state the run writes nothing there: continuing it is fine
    assert train(
        config, "--resume", str(state), "--max_train_steps", "4", "--save_state_on_train_end=false"
    ) == 0
    assert (state / "progress.json").read_bytes() == progress


def test_a_stop_at_the_resumed_step_keeps_the_state_it_resumed_from(
    tmp_path, tiny_model_dir, images, monkeypatch, capsys
):
    config = _config(
        tmp_path, tiny_model_dir, images, max_train_steps=4, save_every_n_steps=2, save_state=True
    )
    original = Saver.after_step

    def stop_after_2(self, global_step):
        original(self, global_step)
        if global_step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(Saver, "after_step", stop_after_2)
    assert train(config) == 130
    monkeypatch.undo()
    state = tmp_path / "c" / "run-step00000002-state"
    inode = os.stat(state).st_ino
    real = step_module.micro_batch_loss
    monkeypatch.setattr(
        "library.training.trainer.micro_batch_loss", lambda i, b: real(i, b) * float("nan")
    )
    capsys.readouterr()
    assert train(config, "--resume", str(state)) == 1  # the loss of step 3 is NaN
    assert f"were saved to {state}" in capsys.readouterr().err
    assert os.stat(state).st_ino == inode  # the very folder, not rewritten


@pytest.mark.parametrize(
    "name", ["fk-step00000002", "fk-000002", "fk-ema", "fk-state", "fk-step00000002-ema"]
)
def test_output_names_ending_like_another_names_files_are_refused_at_load(
    name, tmp_path, tiny_model_dir, images, capsys
):
    config = _config(tmp_path, tiny_model_dir, images)
    assert train(config, "--output_name", name) == 2
    line = _error_line(capsys)
    assert "output_name" in line and 'like the files output_name "fk' in line, line
    assert not (tmp_path / "c").exists()


def _metadata(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as file:
        return file.metadata()


def test_two_runs_whose_names_collide_cannot_clobber_each_other(
    tmp_path, tiny_model_dir, images, monkeypatch
):
    """fk saves fk-step00000002.safetensors at step 2; a run named fk-step00000002 started
    meanwhile in the same folder would write the same file as its final output."""
    out = tmp_path / "out"
    first = write_config(
        tmp_path / "fk.toml", tiny_model_dir, images, out, output_name="fk",
        max_train_steps=3, save_every_n_steps=2,
    )  # fmt: skip
    second = write_config(
        tmp_path / "other.toml", tiny_model_dir, images, out, output_name="fk-step00000002",
        max_train_steps=1, seed=3,
    )  # fmt: skip
    started = {}
    original = Saver.after_step

    def meanwhile(self, global_step):
        if global_step == 1:  # fk is training and holds its lock: the other run starts now
            started["other"] = subprocess.run(
                [sys.executable, "train_network.py", "--config", str(second)],
                cwd=REPO, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        original(self, global_step)

    monkeypatch.setattr(Saver, "after_step", meanwhile)
    assert train(first) == 0
    other = started["other"]
    assert other.returncode == 2, other.stderr[-2000:]
    assert "output_name" in other.stderr and "-step00000002" in other.stderr
    fk_id = _metadata(out / "fk.safetensors")["ss_session_id"]
    assert _metadata(out / "fk-step00000002.safetensors")["ss_session_id"] == fk_id
    assert json.loads((out / "fk-summary.json").read_text())["output_name"] == "fk"
    assert not (out / "fk-step00000002-summary.json").exists()
