"""An edit model's settings that do not fit the model are refused with the fix that applies,
while the plan is made: more references per image than the model takes, a FLUX.1 Kontext
transformer file without model_type, and model_type = "flux_kontext" on a text-to-image
FLUX.1 folder (named before references are asked for)."""

from __future__ import annotations

import pytest

from library.config.loader import load_config
from library.errors import ConfigError, ModelError
from library.training.reference_checks import check_reference_config
from tests.integration.harness import make_images, write_config
from tests.kits.flux.tiny_files import write_tiny_flux_files
from tests.kits.qwenimage.tiny_files import write_tiny_qwenimage_files


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return make_images(root / "targets", 1), make_images(root / "controls", 1, captions=False)


def _error(tmp_path, model, data, error=ConfigError, subset_keys=None, **keys) -> str:
    images, controls = data
    subset = {"control_directory": str(controls), **(subset_keys or {})}
    path = write_config(tmp_path / "c.toml", model, images, tmp_path / "out", subset, **keys)
    with pytest.raises(error) as info:
        check_reference_config(load_config(path))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_kontext_takes_one_reference_per_image(tmp_path, data, kit_folders):
    kontext = kit_folders("flux_kontext", "dev")
    message = _error(tmp_path, kontext, data, subset_keys={"control_count_per_image": 2})
    assert message == (
        "datasets[0].subsets[0].control_count_per_image = 2: a FLUX.1 Kontext model takes 1 "
        "reference image per image; set control_count_per_image = 1 (or remove it)"
    )


def test_a_transformer_file_with_references_is_told_which_setting_makes_it_an_edit_model(
    tmp_path, data
):
    flux = write_tiny_flux_files(tmp_path / "flux")["transformer"]
    message = _error(tmp_path, flux, data)
    assert message.startswith(
        f"datasets[0].subsets[0].control_directory: {flux} is read as a FLUX.1 model"
    )
    assert 'if it is a FLUX.1 Kontext model, set model_type = "flux_kontext" in [flow]' in message
    assert message.endswith("else remove control_directory")
    qwen = write_tiny_qwenimage_files(tmp_path / "qwen")["transformer"]
    message = _error(tmp_path, qwen, data)
    assert 'set model_version = "edit" in [flow]' in message
    assert 'set model_version = "edit-2509" or "edit-2511" in [flow]' in message


def test_a_folder_with_references_still_names_the_edit_models(tmp_path, data, kit_folders):
    flux = kit_folders("flux", "dev")
    message = _error(tmp_path, flux, data)
    assert "a FLUX.1 model learns from images alone" in message and "model_type" not in message


def test_kontext_model_type_on_a_text_to_image_folder_says_so_first(tmp_path, data, kit_folders):
    flux = kit_folders("flux", "dev")
    images, _ = data
    path = write_config(
        tmp_path / "c.toml", flux, images, tmp_path / "o", model_type="flux_kontext"
    )
    with pytest.raises(ModelError) as info:
        check_reference_config(load_config(path))  # the subset has no reference images
    assert str(info.value).startswith(
        f"{flux} holds a text-to-image FLUX.1 (FluxPipeline), not a FLUX.1 Kontext model"
    )
