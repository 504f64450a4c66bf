"""A full fine-tune's file: the trained transformer in the original names, which diffusers'
single-file converter and loader turn back into exactly the transformer's state dict, and which
difftune reads back as a transformer file with its config and variant."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from library.models.families.zimage import keys
from library.models.families.zimage.full_file import write_transformer_file
from tests.kits.zimage.tiny_shapes import TINY_DIM


@pytest.fixture(scope="module")
def trained():
    """The tiny transformer with every weight moved off its initial value (as training does),
    so a swapped or dropped tensor shows."""
    from tests.kits.zimage.tiny import build_tiny_zimage_components

    transformer = build_tiny_zimage_components(seed=5)["transformer"]
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in transformer.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))
    return transformer


def assert_equal_states(ours: dict, theirs: dict, dtype=None) -> None:
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value if dtype is None else value.to(dtype)), key


def test_diffusers_converter_reads_the_file_as_the_trained_state(trained, tmp_path):
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers,
        infer_diffusers_model_type,
    )

    path = write_transformer_file(tmp_path / "z.safetensors", trained)
    saved = load_file(str(path))
    assert "layers.0.attention.qkv.weight" in saved and "x_embedder.weight" in saved
    assert not any(k.startswith(keys.CHECKPOINT_PREFIX) for k in saved)  # a standalone file
    # diffusers' converter takes it as ComfyUI's full checkpoints hold it
    checkpoint = {keys.CHECKPOINT_PREFIX + k: v for k, v in saved.items()}
    assert infer_diffusers_model_type(checkpoint) == "z-image-turbo"
    converted = convert_z_image_transformer_checkpoint_to_diffusers(checkpoint)
    assert_equal_states(converted, trained.state_dict())


def test_diffusers_from_single_file_loads_the_trained_transformer(trained, tmp_path, zimage_dir):
    from diffusers import ZImageTransformer2DModel

    path = write_transformer_file(tmp_path / "z.safetensors", trained, dtype=torch.bfloat16)
    loaded = ZImageTransformer2DModel.from_single_file(
        str(path), config=str(zimage_dir), subfolder="transformer", torch_dtype=torch.bfloat16,
        local_files_only=True,
    )  # fmt: skip
    assert_equal_states(loaded.state_dict(), trained.state_dict(), torch.bfloat16)


def test_difftune_reads_the_file_back_with_its_config_and_variant(trained, tmp_path):
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.zimage.load import load_zimage
    from tests.kits.zimage.tiny_files import write_tiny_zimage_files

    files = write_tiny_zimage_files(tmp_path / "files")
    # the header's scheduler (Base's shift) decides over the file name
    path = write_transformer_file(tmp_path / "turbo.safetensors", trained, 6.0, {"a": "b"})
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["a"] == "b"
    model = ModelSection(pretrained_model_name_or_path=str(path), vae=str(files["ae"]),
                         tokenizer_path=str(files["tokenizer"]))  # fmt: skip
    flow = FlowSection(text_encoder=str(files["text_encoder"]))
    parts = load_zimage(model, flow, torch.float32, torch.float32)
    assert_equal_states(parts.denoiser.state_dict(), trained.state_dict())
    assert parts.denoiser.config.dim == TINY_DIM
    assert list(parts.denoiser.config.axes_dims) == list(trained.config.axes_dims)
    assert parts.family.variant == "base" and parts.family.sampling_shift == 6.0
