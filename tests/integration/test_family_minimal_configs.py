"""Every registered family dry-runs the smallest config its users bring from the tool they
train that family with today: the model, the images, the network module and rank, the output
folder, nothing else. A default they never wrote (difftune's or kohya's) must never stop it.

kohya's users write a flat args file with ``train_data_dir`` (DreamBooth folders named
``<repeats>_<name>``); musubi-tuner's users give a dataset config of their own format
(``image_directory``, ``control_directory`` for an edit model) next to their arguments.
"""

from __future__ import annotations

import pytest

from library.models.families import registry
from tests.integration.harness import make_images, mirrored_references, train
from tests.kits import kit_of

# Family -> the tool whose files its users bring ("kohya": sd-scripts; "musubi": musubi-tuner).
PEER_TOOL = {
    "sd": "kohya",
    "flux": "kohya",
    "sd3": "kohya",
    "chroma": "kohya",
    "flux_kontext": "musubi",
    "zimage": "musubi",
    "qwenimage": "musubi",
    "qwenimage_edit": "musubi",
    "qwenimage_edit_plus": "musubi",
    "flux2": "musubi",
    "krea2": "musubi",
    "wan": "musubi",
}


def _entries():
    return [pytest.param(entry, id=entry.name) for entry in registry.families()]


def _kohya_files(root, entry, model) -> str:
    images = root / "train" / "2_shape"
    make_images(images, 2)
    return f'train_data_dir = "{images.parent}"\n'


def _musubi_files(root, entry, model) -> str:
    images = make_images(root / "images", 2)
    dataset = [
        "[general]",
        'caption_extension = ".txt"',
        "batch_size = 1",
        "enable_bucket = true",
        "[[datasets]]",
        f'image_directory = "{images}"',
        f'cache_directory = "{root / "cache"}"',
        "num_repeats = 1",
    ]
    if entry.reference_images[0]:
        references = mirrored_references(images, root / "references")
        dataset.append(f'control_directory = "{references}"')
    path = root / "dataset.toml"
    path.write_text("\n".join(dataset) + "\n", encoding="utf-8")
    return f'dataset_config = "{path}"\n'


@pytest.mark.parametrize("entry", _entries())
def test_the_minimal_config_of_every_family_dry_runs(tmp_path, entry, capfd, kit_folders):
    assert entry.name in PEER_TOOL, f"say whose files {entry.label} users bring: PEER_TOOL"
    kit = kit_of(entry.name)
    if kit is None:
        pytest.skip(f"{entry.label} has no test kit (tests/kits/) to write a tiny model with")
    model = kit_folders(entry.name)
    data = {"kohya": _kohya_files, "musubi": _musubi_files}[PEER_TOOL[entry.name]]
    config = tmp_path / "args.toml"
    config.write_text(
        f'pretrained_model_name_or_path = "{model}"\n'
        + data(tmp_path, entry, model)
        + f'network_module = "{entry.network_module}"\n'
        + "network_dim = 4\n"
        + f'output_dir = "{tmp_path / "out"}"\n',
        encoding="utf-8",
    )
    code = train(config, "--dry_run")
    err = capfd.readouterr().err
    assert code == 0, err
    assert "error" not in err
