"""Reference-image sizes an edit model cannot run are refused while the plan is made, as the
targets' resolution is: with buckets off every reference is resized to exactly
control_resolution, so it must be on the model's grid (16 for FLUX.1 Kontext's and
Qwen-Image-Edit's 2x2 patches over the VAE's 8); references kept at their own size are rounded
to bucket_reso_steps, which must be on it too."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from library.training.image_sizes import nearest_multiples
from tests.integration.harness import flat_toml_lines, make_images, train

FAMILIES = {  # test name -> (its kit's name, the run's keys)
    "kontext": ("flux_kontext", {"network_module": "networks.lora_flux",
                                 "guidance_scale": 1.0, "train_blocks": "double"}),
    "qwen-edit": ("qwenimage_edit", {"network_module": "networks.lora_qwen_image"}),
}  # fmt: skip
GRID = 16


@pytest.fixture(scope="module")
def models(kit_folders):
    return {name: kit_folders(kit) for name, (kit, _) in FAMILIES.items()}


@pytest.fixture(scope="module")
def edit_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("edit")
    targets = make_images(root / "targets", 2, size=64)
    (root / "controls").mkdir()
    for target in sorted(targets.glob("*.png")):
        with Image.open(target) as image:
            image.resize((72, 72)).save(root / "controls" / target.name)
    return root


def _config(tmp_path, model, family, root, *dataset_lines):
    dataset = tmp_path / "dataset.toml"
    lines = ["[general]", "resolution = [256, 256]", 'caption_extension = ".txt"',
             "enable_bucket = false", "", "[[datasets]]",
             f'image_directory = "{root / "targets"}"',
             f'control_directory = "{root / "controls"}"', *dataset_lines]  # fmt: skip
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    keys = {"pretrained_model_name_or_path": str(model), "dataset_config": str(dataset),
            "output_dir": str(tmp_path / "out"), "output_name": "run",
            "network_train_unet_only": True, "network_dim": 4, "max_train_steps": 1,
            **FAMILIES[family][1]}  # fmt: skip
    config = tmp_path / "c.toml"
    config.write_text("\n".join(flat_toml_lines(keys)) + "\n", encoding="utf-8")
    return config


def _error(capsys) -> str:
    lines = re.findall(r"(?m)^error: (.*)$", capsys.readouterr().err)
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.integration
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("written", ["control_resolution", "qwen_image_edit_control_resolution"])
def test_a_control_resolution_off_the_grid_is_refused_before_any_weight_is_read(
    tmp_path, models, edit_data, capsys, family, written
):
    if written.startswith("qwen") and family != "qwen-edit":
        pytest.skip("Qwen-Image-Edit's own word")
    side = 72  # a multiple of the VAE's 8, not of the 2x2 patches' 16
    config = _config(tmp_path, models[family], family, edit_data, f"{written} = [{side}, {side}]")
    use = " or ".join(str(v) for v in nearest_multiples(side, GRID))
    for extra in (["--dry_run"], []):
        assert train(config, *extra) == 2
        error = _error(capsys)
        assert f"control_resolution = {side} (set in {tmp_path / 'dataset.toml'})" in error, error
        assert f"multiples of {GRID}" in error and f"use {use}" in error, error
    assert not (tmp_path / "out").exists()  # found before the run took its output name
    on_grid = _config(tmp_path, models[family], family, edit_data, "control_resolution = [80, 64]")
    assert train(on_grid, "--dry_run") == 0


@pytest.mark.integration
def test_references_kept_at_their_size_need_a_bucket_step_on_the_grid(
    tmp_path, models, edit_data, capsys
):
    lines = ["no_resize_control = true", "bucket_reso_steps = 8"]  # 72x72 would stay 72x72
    config = _config(tmp_path, models["kontext"], "kontext", edit_data, *lines)
    assert train(config, "--dry_run") == 2
    error = _error(capsys)
    assert "bucket_reso_steps = 8" in error and "use 16" in error, error
