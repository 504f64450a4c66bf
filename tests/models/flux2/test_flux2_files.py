"""FLUX.2 single files without difftune's header: sizes read off the shapes; base or distilled
by the file's name (or difftune's header)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.loader import load_components
from tests.kits.flux2.tiny import text_encoder_config, transformer_config
from tests.kits.flux2.tiny_files import write_tiny_flux2_files


def _headerless(path: Path, name: str) -> Path:
    out = path.with_name(name)
    save_file(load_file(str(path)), str(out), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize(
    ("name", "distilled"),
    [("flux-2-klein-4b.safetensors", True), ("flux-2-klein-base-4b.safetensors", False),
     ("my_finetune.safetensors", False)],
)  # fmt: skip
def test_a_file_without_header_is_sized_by_its_shapes_and_named_base_or_distilled(
    tmp_path, name, distilled
):
    files = write_tiny_flux2_files(tmp_path / "f")
    model = ModelSection(
        pretrained_model_name_or_path=str(_headerless(files["transformer"], name)),
        tokenizer_path=str(files["tokenizer"]), vae=str(files["vae"]),
    )  # fmt: skip
    parts = load_components(
        model, torch.float32, FlowSection(text_encoder=str(files["text_encoder"]))
    )
    config = dict(parts.denoiser.config)
    for key, value in transformer_config().items():
        assert tuple(config[key]) == value if isinstance(value, tuple) else config[key] == value, (
            key
        )
    assert parts.family.distilled is distilled
    assert parts.text_encoders[0].config.hidden_size == text_encoder_config()["hidden_size"]


def test_a_text_encoder_of_another_width_is_refused_by_name(tmp_path):
    files = write_tiny_flux2_files(tmp_path / "f")
    state = load_file(str(files["text_encoder"]))
    wider = {k: torch.zeros([s * 2 if s == 8 else s for s in v.shape]) for k, v in state.items()}
    other = tmp_path / "qwen_other.safetensors"
    save_file(wider, str(other))
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]),
                         tokenizer_path=str(files["tokenizer"]), vae=str(files["vae"]))  # fmt: skip
    with pytest.raises(ModelError, match="text_encoder = .*qwen_other.*set text_encoder"):
        load_components(model, torch.float32, FlowSection(text_encoder=str(other)))
    # the same file replacing a folder's text_encoder/, refused before any weight is read
    from tests.kits.flux2.tiny import write_tiny_flux2_folder

    folder = ModelSection(
        pretrained_model_name_or_path=str(write_tiny_flux2_folder(tmp_path / "d"))
    )
    with pytest.raises(ModelError, match="text_encoder = .*qwen_other.*set text_encoder"):
        load_components(folder, torch.float32, FlowSection(text_encoder=str(other)))
