"""Component keys are never dropped: with a diffusers folder as the model, a [flow] clip_l,
clip_g, t5xxl or ae file replaces the folder's part (as with the single files), and
t5_tokenizer_path / tokenizer_path its tokenizers; a key naming a missing file or a folder is
refused by name, before any weight is read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.loader import load_components
from library.models.model_files import shapes_only

FLUX_PARTS = {"clip_l": "text_encoder", "t5xxl": "text_encoder_2", "ae": "vae"}


def load(path: Path, **keys):
    flow = {k: str(v) for k, v in keys.items() if k in FlowSection.model_fields}
    model = {k: str(v) for k, v in keys.items() if k not in flow}
    return load_components(
        ModelSection(pretrained_model_name_or_path=str(path), **model),
        torch.float32,
        FlowSection(**flow),
    )


def error(path: Path, **keys) -> str:
    with pytest.raises(ModelError) as info, shapes_only():
        load(path, **keys)
    message = str(info.value)
    assert "\n" not in message
    return message


def assert_state(module: torch.nn.Module, want: dict[str, torch.Tensor]) -> None:
    got = module.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value.to(got[key].dtype)), key


@pytest.fixture(scope="module")
def flux_folder(kit_folders) -> Path:
    """FLUX.1 [dev]'s tiny folder (seed 0), the session's: read only."""
    return kit_folders("flux", "dev")


@pytest.fixture(scope="module")
def other_files(tmp_path_factory) -> dict[str, Path]:
    """FLUX.1 component files of another seed, in float32 (the folder's are seed 0)."""
    from tests.kits.flux.tiny_files import write_tiny_flux_files

    return write_tiny_flux_files(tmp_path_factory.mktemp("files"), "dev", 1, dtype=torch.float32)


def test_flux_folder_takes_the_component_files(flux_folder, other_files):
    """They used to be dropped without a word: the folder's own parts trained."""
    from tests.kits.flux.tiny import build_tiny_flux_components

    keys = {k: other_files[k] for k in FLUX_PARTS}
    parts = load(flux_folder, **keys, t5_tokenizer_path=other_files["t5_tokenizer"])
    seed_0, seed_1 = build_tiny_flux_components("dev", 0), build_tiny_flux_components("dev", 1)
    assert_state(parts.denoiser, seed_0["transformer"].state_dict())
    loaded = {"clip_l": parts.text_encoders[0], "t5xxl": parts.text_encoders[1], "ae": parts.vae}
    for key, sub in FLUX_PARTS.items():
        assert_state(loaded[key], seed_1[sub].state_dict())
        assert not torch.equal(
            next(iter(loaded[key].state_dict().values())),
            next(iter(seed_0[sub].state_dict().values())),
        )  # the seeds differ, so the folder's part was not kept
    assert Path(parts.tokenizers[1].name_or_path) == other_files["t5_tokenizer"]
    # one key alone replaces one part
    parts = load(flux_folder, clip_l=other_files["clip_l"])
    assert_state(parts.text_encoders[0], seed_1["text_encoder"].state_dict())
    assert_state(parts.text_encoders[1], seed_0["text_encoder_2"].state_dict())


@pytest.mark.parametrize("key", sorted(FLUX_PARTS))
def test_flux_folder_with_a_component_key_naming_no_file(flux_folder, tmp_path, key):
    missing = tmp_path / f"{key}.safetensors"
    message = error(flux_folder, **{key: missing})
    assert message.startswith(f"{key} = {missing} is not a file (nothing is there)")
    message = error(flux_folder, **{key: tmp_path})
    assert message.startswith(f"{key} = {tmp_path} is a folder; set {key} in [flow]")


def test_flux_folder_t5_tokenizer_path_naming_no_tokenizer(flux_folder, tmp_path):
    message = error(flux_folder, t5_tokenizer_path=tmp_path)
    assert f"t5_tokenizer_path {tmp_path} has no tokenizer.json" in message
    a_file = tmp_path / "tokenizer.json"
    a_file.write_text("{}")
    message = error(flux_folder, t5_tokenizer_path=a_file)
    assert f"t5_tokenizer_path {a_file} is a file" in message


def test_flux_folder_without_the_parts_that_files_replace(flux_folder, other_files, tmp_path):
    model = Path(shutil.copytree(flux_folder, tmp_path / "no-t5"))
    shutil.rmtree(model / "text_encoder_2")
    shutil.rmtree(model / "tokenizer_2")
    assert "lacks the text_encoder_2/ subfolder" in error(model)
    with shapes_only():
        parts = load(
            model, t5xxl=other_files["t5xxl"], t5_tokenizer_path=other_files["t5_tokenizer"]
        )
    assert parts.text_encoders[1].config.d_model == parts.denoiser.config.joint_attention_dim


@pytest.fixture(scope="module")
def sd_clip_file(tmp_path_factory) -> Path:
    """An SD 1.x CLIP text encoder (32 wide) in clip_l.safetensors' names."""
    from library.models import original_names as names
    from tests.kits.sd.tiny import build_tiny_components

    encoder = build_tiny_components("sd1")["text_encoder"]
    path = tmp_path_factory.mktemp("sd-clip") / "clip_l.safetensors"
    state = names.with_text_model_prefix(encoder.state_dict())
    save_file({k: v.contiguous() for k, v in state.items() if "position_ids" not in k}, path)
    return path


def test_flux_clip_l_of_another_width(flux_folder, other_files, sd_clip_file):
    """It used to load and fail at step 1 on a shape; refused on both routes."""
    from tests.kits.flux.tiny_shapes import TINY_CLIP_WIDTH

    for model, keys in (
        (flux_folder, {}),
        (other_files["transformer"], {k: other_files[k] for k in FLUX_PARTS}),
    ):
        keys = {**keys, "tokenizer_path": other_files["tokenizer"],
                "t5_tokenizer_path": other_files["t5_tokenizer"]}  # fmt: skip
        message = error(model, **{**keys, "clip_l": sd_clip_file})
        assert message.startswith(f"clip_l = {sd_clip_file} is 32 wide and the transformer of")
        assert f"takes {TINY_CLIP_WIDTH}-wide CLIP-L output" in message


# --- SD3 --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sd3_folder(kit_folders) -> Path:
    """SD3.5 Medium's tiny folder (seed 0), the session's: read only."""
    return kit_folders("sd3", "sd3.5-medium")


@pytest.fixture(scope="module")
def sd3_files(tmp_path_factory) -> dict[str, Path]:
    from tests.kits.sd3.tiny_files import write_tiny_sd3_files

    return write_tiny_sd3_files(
        tmp_path_factory.mktemp("sd3-files"), "sd3.5-medium", 1, text_encoders_inside=False,
        dtype=torch.float32,
    )  # fmt: skip


def test_sd3_folder_takes_the_component_files(sd3_folder, sd3_files):
    from tests.kits.sd3.tiny import build_tiny_sd3_components

    t5_tokenizer = sd3_files["t5_tokenizer"]
    parts = load(sd3_folder, clip_g=sd3_files["clip_g"], t5_tokenizer_path=t5_tokenizer)
    seed_0 = build_tiny_sd3_components("sd3.5-medium", 0)
    seed_1 = build_tiny_sd3_components("sd3.5-medium", 1)
    assert_state(parts.text_encoders[0], seed_0["text_encoder"].state_dict())
    assert_state(parts.text_encoders[1], seed_1["text_encoder_2"].state_dict())
    assert_state(parts.text_encoders[2], seed_0["text_encoder_3"].state_dict())
    assert Path(parts.tokenizers[2].name_or_path) == t5_tokenizer


@pytest.mark.parametrize("key", ["clip_l", "clip_g", "t5xxl"])
def test_sd3_folder_with_a_component_key_naming_no_file(sd3_folder, tmp_path, key):
    missing = tmp_path / f"{key}.safetensors"
    assert error(sd3_folder, **{key: missing}).startswith(f"{key} = {missing} is not a file")
    message = error(sd3_folder, **{key: tmp_path})
    assert message.startswith(f"{key} = {tmp_path} is a folder; set {key} in [flow]")


def test_sd3_clip_g_of_another_width(sd3_folder, sd3_files):
    message = error(sd3_folder, clip_g=sd3_files["clip_l"])
    assert "the CLIPs do not fit" in message and f"clip_g = {sd3_files['clip_l']}" in message
