"""Z-Image from Comfy-Org's single files: the tiny transformer, Qwen3 and AE files (the released
key names, written from the tiny folder's weights) load to the folder's weights, in every key
layout the files come in; a file with a missing or misshapen tensor is refused naming the file
and the key before any weight is read."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.zimage import keys
from library.models.families.zimage.load import load_zimage
from tests.kits.zimage.tiny_files import write_tiny_zimage_files


@pytest.fixture(scope="module")
def folder_parts(zimage_dir):
    return load_zimage(ModelSection(pretrained_model_name_or_path=str(zimage_dir)),
                       FlowSection(), torch.float32, torch.float32)  # fmt: skip


def _load(files: dict, dtype=torch.float32, **flow):
    keys = {"pretrained_model_name_or_path": str(files["transformer"]),
            "tokenizer_path": str(files["tokenizer"]), "vae": str(files["ae"])}  # fmt: skip
    keys |= {k: v for k, v in flow.items() if k in ModelSection.model_fields}
    flow = {"text_encoder": str(files["text_encoder"]), **flow}
    flow = {k: v for k, v in flow.items() if k in FlowSection.model_fields}
    return load_zimage(ModelSection(**keys), FlowSection(**flow), dtype, dtype)


def _modules(components):
    return {"transformer": components.denoiser, "vae": components.vae,
            "text_encoder": components.text_encoders[0]}  # fmt: skip


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, dtype=None) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for key in sa:
        expected = sb[key] if dtype is None else sb[key].to(dtype)
        assert torch.equal(sa[key], expected), key


@pytest.mark.parametrize(
    "layout",
    [
        # (Comfy-Org's own layout, both variants, is the conformance suite's)
        {"transformer_prefix": keys.CHECKPOINT_PREFIX, "text_prefix": ""},
        {"config_metadata": False},  # the sizes read off the shapes
    ],
    ids=["prefixes", "shapes"],
)
def test_single_files_load_to_the_folders_weights(tmp_path, folder_parts, layout):
    files = write_tiny_zimage_files(tmp_path, dtype=torch.float32, **layout)
    parts = _load(files)
    for name, module in _modules(parts).items():
        assert_same_weights(module, _modules(folder_parts)[name])
    assert parts.family.variant == "turbo" and parts.family.sampling_shift == 3.0
    assert parts.objective.sampler("euler").config.shift == 3.0
    # the same captions encode to the same states
    tokenizer = parts.tokenizers[0]
    assert tokenizer("a cat").input_ids == folder_parts.tokenizers[0]("a cat").input_ids


def test_bf16_files_load_as_the_folder_cast_to_bf16(tmp_path, folder_parts):
    parts = _load(write_tiny_zimage_files(tmp_path), torch.bfloat16)
    for name, module in _modules(parts).items():
        assert_same_weights(module, _modules(folder_parts)[name], torch.bfloat16)


def test_flow_files_replace_the_folders_parts(tmp_path, zimage_dir, folder_parts):
    files = write_tiny_zimage_files(tmp_path, seed=1, dtype=torch.float32)
    model = ModelSection(pretrained_model_name_or_path=str(zimage_dir), vae=str(files["ae"]))
    flow = FlowSection(text_encoder=str(files["text_encoder"]))
    parts = load_zimage(model, flow, torch.float32, torch.float32)
    seed1 = _load(files)
    assert_same_weights(parts.denoiser, folder_parts.denoiser)
    assert_same_weights(parts.vae, seed1.vae)
    assert_same_weights(parts.text_encoders[0], seed1.text_encoders[0])


def _rewrite(path, change) -> None:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata=metadata)


@pytest.fixture
def no_reads(monkeypatch):
    def refuse(self, key):
        raise AssertionError(f"read {key} before every file was checked")

    monkeypatch.setattr(CheckpointFile, "tensor", refuse)


@pytest.mark.parametrize(
    ("part", "key", "change", "header"),
    [
        ("transformer", "layers.1.attention.qkv.weight", "drop", False),
        ("transformer", "noise_refiner.0.attention.out.weight", "reshape", False),
        # a tensor the sizes are read from: the header's config says which one is wrong
        ("transformer", "cap_embedder.1.weight", "reshape", True),
        ("text_encoder", "model.layers.2.mlp.up_proj.weight", "drop", False),
        ("text_encoder", "model.norm.weight", "reshape", False),
        ("text_encoder", "model.embed_tokens.weight", "drop", False),
        ("text_encoder", "model.layers.0.self_attn.k_proj.weight", "reshape", True),
    ],
)
def test_a_missing_or_misshapen_tensor_is_refused_by_name(
    tmp_path, no_reads, part, key, change, header
):
    files = write_tiny_zimage_files(tmp_path, config_metadata=header)

    def edit(tensors):
        if change == "drop":
            del tensors[key]
        else:
            tensors[key] = torch.zeros(*tensors[key].shape[:-1], tensors[key].shape[-1] + 1)

    _rewrite(files[part], edit)
    with pytest.raises(ModelError) as caught:
        _load(files)
    message = str(caught.value)
    assert "\n" not in message
    assert str(files[part]) in message and key in message


def test_missing_component_files_and_tokenizer_are_named(tmp_path):
    files = write_tiny_zimage_files(tmp_path)
    with pytest.raises(ModelError, match="set text_encoder"):
        _load(files, text_encoder=None)
    with pytest.raises(ModelError, match=r"set vae = .* in \[model\]"):
        _load(files, vae=None)
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]),
                         vae=str(files["ae"]))  # fmt: skip
    flow = FlowSection(text_encoder=str(files["text_encoder"]))
    with pytest.raises(ModelError, match="set tokenizer_path"):
        load_zimage(model, flow, torch.float32, torch.float32)


def test_files_given_in_the_wrong_place_are_refused(tmp_path):
    files = write_tiny_zimage_files(tmp_path)
    with pytest.raises(ModelError, match="text_encoder = .*ae.safetensors is not"):
        _load(files, text_encoder=str(files["ae"]))
    with pytest.raises(ModelError, match="^vae = .*qwen_3_4b.safetensors is not") as caught:
        _load(files, vae=str(files["text_encoder"]))
    assert "set vae in [model]" in str(caught.value)


def test_a_vae_folder_serves_the_single_files(tmp_path, zimage_dir, folder_parts):
    files = write_tiny_zimage_files(tmp_path, seed=2, dtype=torch.float32)
    parts = _load(files, vae=str(zimage_dir / "vae"))
    assert_same_weights(parts.vae, folder_parts.vae)
