"""The Z-Image key table against diffusers' own single-file converter and loader, and both
directions on the tiny transformer."""

from __future__ import annotations

import pytest
import torch

from library.models.families.zimage import keys
from tests.kits.zimage.tiny_shapes import TINY_DIM


@pytest.fixture(scope="module")
def diffusers_sd():
    from tests.kits.zimage.tiny import build_tiny_zimage_components

    return build_tiny_zimage_components(seed=3)["transformer"].state_dict()


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_round_trip_is_exact(diffusers_sd):
    original = keys.diffusers_to_original(diffusers_sd)
    assert_same(keys.original_to_diffusers(original), diffusers_sd)
    prefixed = keys.diffusers_to_original(diffusers_sd, keys.CHECKPOINT_PREFIX)
    assert all(k.startswith(keys.CHECKPOINT_PREFIX) for k in prefixed)
    assert_same(keys.original_to_diffusers(prefixed), diffusers_sd)


def test_original_names(diffusers_sd):
    original = keys.diffusers_to_original(diffusers_sd)
    assert original["layers.1.attention.qkv.weight"].shape == (3 * TINY_DIM, TINY_DIM)
    for name in (
        "x_embedder.weight",
        "final_layer.linear.bias",
        "final_layer.adaLN_modulation.1.weight",
        "noise_refiner.0.attention.q_norm.weight",
        "context_refiner.1.attention.out.weight",
        "layers.0.adaLN_modulation.0.weight",
        "t_embedder.mlp.2.weight",
        "cap_embedder.0.weight",
        "x_pad_token",
    ):
        assert name in original, name
    assert not [k for k in original if "to_q" in k or "all_" in k or "norm_k" in k]
    blocks = {k.rsplit(".attention.", 1)[0] for k in diffusers_sd if k.endswith("to_q.weight")}
    assert len(blocks) == 6  # 2 joint, 2 noise refiner, 2 context refiner
    assert len(original) == len(diffusers_sd) - 2 * len(blocks)  # q, k, v -> one per block
    qkv = original["context_refiner.0.attention.qkv.weight"]
    assert torch.equal(
        qkv[TINY_DIM : 2 * TINY_DIM], diffusers_sd["context_refiner.0.attention.to_k.weight"]
    )


def test_diffusers_converter_reads_our_original_layout(diffusers_sd):
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers,
        infer_diffusers_model_type,
    )

    checkpoint = keys.diffusers_to_original(diffusers_sd, keys.CHECKPOINT_PREFIX)
    # the unused norm some single files carry: diffusers drops it, as we do
    checkpoint[keys.CHECKPOINT_PREFIX + "norm_final.weight"] = torch.ones(TINY_DIM)
    assert infer_diffusers_model_type(checkpoint) == "z-image-turbo"
    ours = keys.original_to_diffusers(checkpoint)
    theirs = convert_z_image_transformer_checkpoint_to_diffusers(dict(checkpoint))
    assert_same(theirs, diffusers_sd)
    assert_same(ours, diffusers_sd)


def test_diffusers_single_file_loader_reads_our_file(diffusers_sd, zimage_dir, tmp_path):
    from diffusers import ZImageTransformer2DModel
    from safetensors.torch import save_file

    path = tmp_path / "z_image.safetensors"
    original = keys.diffusers_to_original(diffusers_sd)  # a standalone file: no prefix
    save_file({k: v.contiguous() for k, v in original.items()}, str(path))
    model = ZImageTransformer2DModel.from_single_file(
        str(path), config=str(zimage_dir), subfolder="transformer", local_files_only=True
    )
    assert_same(model.state_dict(), diffusers_sd)


def test_name_functions_are_inverse(diffusers_sd):
    for name in keys.diffusers_to_original(diffusers_sd):
        targets = keys.diffusers_names(name)
        assert all(keys.original_name(t) == name for t in targets)
        assert all(t in diffusers_sd for t in targets)
    assert keys.diffusers_names("norm_final.weight") == ()
    # only whole block names are renamed
    assert keys.original_name("layers.x.attention.to_q.weight") == "layers.x.attention.to_q.weight"


def test_fusing_needs_all_three_projections(diffusers_sd):
    partial = {k: v for k, v in diffusers_sd.items() if k != "layers.0.attention.to_v.weight"}
    with pytest.raises(KeyError, match="layers.0.attention.to_v.weight"):
        keys.diffusers_to_original(partial)
    with pytest.raises(ValueError, match="does not split"):
        keys.original_to_diffusers({"layers.0.attention.qkv.weight": torch.zeros(4, 2)})
