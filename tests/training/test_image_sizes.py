"""Sizes the model cannot run are found while the plan is made, in --dry_run too, before any
weight is read: FLUX.1's and SD3's transformers need image sides in multiples of 16 (the VAE's 8
times their 2x2 patches), SD's UNets multiples of 8."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from library.training import trainer
from library.training.image_sizes import nearest_multiples
from tests.integration.harness import make_images, train, write_config
from tests.kits.flux.tiny_files import write_tiny_flux_folder
from tests.kits.sd3.tiny_files import write_tiny_sd3_folder

FLUX = {
    "network_module": "networks.lora_flux",
    "network_train_unet_only": True,
    "timestep_sampling": "shift",
    "model_prediction_type": "raw",
    "guidance_scale": 1.0,
}
SD3 = {"network_module": "networks.lora_sd3", "network_train_unet_only": True}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("models")
    return {
        "flux": (write_tiny_flux_folder(root / "flux", "dev", seed=0), FLUX),
        "sd3": (write_tiny_sd3_folder(root / "sd3", "sd3.5-medium", 0), SD3),
        "sd": (tiny_model_dir, {}),
    }


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 2, size=96)


def _config(tmp_path: Path, models, family: str, images, name: str = "run", **keys) -> Path:
    model, family_keys = models[family]
    keys = {"max_train_steps": 1, **family_keys, **keys}
    return write_config(tmp_path / f"{name}.toml", model, images, tmp_path / name, **keys)


def _error(capsys) -> str:
    lines = re.findall(r"(?m)^error: (.*)$", capsys.readouterr().err)
    assert len(lines) == 1
    return lines[0]


def test_nearest_multiples():
    assert nearest_multiples(1000, 16) == [992, 1008]
    assert nearest_multiples(1024, 16) == [1024]
    assert nearest_multiples(24, 16) == [16, 32]
    assert nearest_multiples(8, 16) == [16]


@pytest.mark.integration
@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_a_resolution_off_the_transformers_grid_is_refused_in_the_dry_run(
    tmp_path, models, images, capsys, family
):
    config = _config(tmp_path, models, family, images, resolution=72)
    assert train(config, "--dry_run") == 2
    error = _error(capsys)
    assert "datasets[0].resolution = 72 (set in" in error and "multiples of 16" in error
    assert "use 64 or 80" in error
    # found before the run takes its output name: no weight read, nothing written
    assert train(config) == 2 and "datasets[0].resolution = 72" in _error(capsys)
    assert not (tmp_path / "run").exists()
    rectangle = _config(tmp_path, models, family, images, "r", resolution=[72, 64])
    assert train(rectangle, "--dry_run") == 2
    assert "use [64, 64] or [80, 64]" in _error(capsys)


@pytest.mark.integration
def test_the_refused_resolution_would_fail_and_the_suggested_one_trains(
    tmp_path, models, images, monkeypatch, capsys
):
    assert train(_config(tmp_path, models, "flux", images, "ok", resolution=80)) == 0
    monkeypatch.setattr(trainer, "check_image_sizes", lambda config, prompts=(): [])
    # without the check, the memory estimate's forward pass on the run's shapes stops it before
    # training, and past that (ignore_memory_estimate) the run fails at its first step
    bad = _config(tmp_path, models, "flux", images, "bad", resolution=72)
    assert train(bad) == 2
    assert "the model cannot run this run's shapes (latent size 9x9 is not a multiple" in _error(
        capsys
    )
    with pytest.raises(ValueError, match="is not a multiple of the 2x2 patch"):
        train(bad, "--ignore_memory_estimate")
    assert not (tmp_path / "bad" / "run.safetensors").exists()


@pytest.mark.integration
def test_sd_models_take_any_multiple_of_8(tmp_path, models, images):
    assert train(_config(tmp_path, models, "sd", images, resolution=72)) == 0


@pytest.mark.integration
def test_bucket_steps_off_the_grid_are_refused_before_the_model_loads(
    tmp_path, models, images, capsys
):
    keys = {"enable_bucket": True, "bucket_reso_steps": 24, "min_bucket_reso": 72}
    config = _config(tmp_path, models, "flux", images, resolution=96, max_bucket_reso=96, **keys)
    assert train(config) == 2
    error = _error(capsys)
    assert "datasets[0].bucket_reso_steps = 24" in error and "use 16 or 32" in error
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_sample_sizes_off_the_grid_are_drawn_rounded_with_a_warning(
    tmp_path, models, images, capsys
):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a shape --w 104 --h 64\nanother --w 96 --h 96\n", encoding="utf-8")
    config = _config(
        tmp_path, models, "flux", images, resolution=64, sample_prompts=str(prompts),
        sample_every_n_steps=1,
    )  # fmt: skip
    assert train(config, "--dry_run") == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "sample prompt" in line]
    assert said == [
        "warning: sample prompt 1 asks for 104x64; Flux.1 draws sides in multiples of 16 (as "
        "sd-scripts does), so it is drawn at 96x64"
    ]


@pytest.mark.integration
def test_the_dry_run_shows_the_loaded_transformers_blocks(tmp_path, models, images, capsys):
    """A transformer file without a header is sized by its shapes (pruned models load): the
    dry run's model line says how many blocks it has."""
    from tests.kits.flux.tiny_shapes import tiny_transformer_config

    config = _config(tmp_path, models, "flux", images)
    assert train(str(config), "--dry_run") == 0
    tiny = tiny_transformer_config()
    blocks = f"{tiny['num_layers']} double + {tiny['num_single_layers']} single blocks"
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  model: ")]
    assert line.startswith("  model: FLUX.1 dev (") and blocks in line

