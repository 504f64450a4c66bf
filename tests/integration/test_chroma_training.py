"""Chroma end to end through the CLI on the tiny ChromaPipeline folder: a LoRA trains for two
steps on captions of different lengths, its first step's loss equals the loss written out from
diffusers' pipeline (its T5 encoding and attention mask, as booleans), and the saved file holds
kohya's names of the original model's blocks, which diffusers' ChromaPipeline.load_lora_weights
applies exactly (after fuse_lora: base + alpha / r * up @ down of the file's factors, each
fused module's rows on its diffusers Linears). A full fine-tune writes the trained transformer in
the original names, which diffusers' converter and difftune's single-file reader read back."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.models.loader import load_components
from tests.integration.harness import make_images, tensors, train, write_config
from tests.kits.chroma.kit import reference_loss
from tests.kits.chroma.tiny_files import write_tiny_chroma_files

CHROMA = {
    "network_module": "networks.lora_flux",
    "network_train_unet_only": True,
    "bucket_reso_steps": 16,
    "max_train_steps": 2,
    "train_batch_size": 2,
}
SEED = 7  # write_config's
# diffusers' kohya converter splits a single block's linear1 at FLUX.1's width (3072, written
# into it), which the tiny model does not have: those modules are checked by hand below.
LINEAR1 = "_linear1"


@pytest.fixture(scope="module")
def chroma_dir(kit_folders):
    """The session's tiny kit folder (chroma chroma, seed 0): read only."""
    return kit_folders("chroma", "chroma")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = make_images(tmp_path_factory.mktemp("data") / "imgs", 2, size=64)
    (folder / "img01.txt").write_text("a much longer caption of shape number one on a gradient")
    return folder


@pytest.fixture(scope="module")
def pipe(chroma_dir):
    from diffusers import ChromaPipeline

    return ChromaPipeline.from_pretrained(chroma_dir, local_files_only=True)


def _module(key: str) -> str:
    return key.rsplit(".", 2)[0] if key.endswith(".weight") else key.rsplit(".", 1)[0]


# kohya module -> (diffusers Linears in the order of the fused weight's rows)
def _parts(module: str) -> tuple[str, ...]:
    _, _, rest = module.partition("lora_unet_")
    kind, _, tail = rest.partition("_blocks_")
    index, _, layer = tail.partition("_")
    if kind == "single":
        block = f"single_transformer_blocks.{index}."
        if layer == "linear1":
            return tuple(block + p for p in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"))
        return (block + "proj_out",)
    block = f"transformer_blocks.{index}."
    table = {
        "img_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
        "img_attn_proj": ("attn.to_out.0",),
        "img_mlp_0": ("ff.net.0.proj",),
        "img_mlp_2": ("ff.net.2",),
        "txt_attn_qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
        "txt_attn_proj": ("attn.to_add_out",),
        "txt_mlp_0": ("ff_context.net.0.proj",),
        "txt_mlp_2": ("ff_context.net.2",),
    }
    return tuple(block + p for p in table[layer])


def test_lora_trains_and_diffusers_applies_the_file(tmp_path, chroma_dir, images, pipe,
                                                    monkeypatch):  # fmt: skip
    from safetensors.torch import save_file

    from library.training import trainer

    first: list = []
    real = trainer.micro_batch_loss

    def recording(inputs, batch):
        loss = real(inputs, batch)
        if not first:
            first.append(({k: v for k, v in batch.items()}, loss.detach()))
        return loss

    monkeypatch.setattr(trainer, "micro_batch_loss", recording)
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", chroma_dir, images, out, **CHROMA)
    assert train(config) == 0

    batch, loss = first[0]
    assert len(set(batch["captions"])) == 2
    with torch.no_grad():
        expected = reference_loss(pipe, {**batch, "pixel_values": batch["pixel_values"].float(),
                                         "loss_weights": batch["loss_weights"].float()}, SEED)  # fmt: skip
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=0)

    path = out / "run.safetensors"
    saved = tensors(path)
    modules = {_module(k) for k in saved}
    # every Linear of the 2 double blocks (8 kohya modules each) and 2 single blocks (2 each)
    assert len(modules) == 2 * 8 + 2 * 2
    assert {"lora_unet_double_blocks_1_img_attn_qkv", "lora_unet_single_blocks_0_linear1",
            "lora_unet_double_blocks_0_txt_mlp_2"} <= modules  # fmt: skip
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_up.weight"))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "networks.lora_flux"
    assert meta["ss_base_model_version"] == "chroma"
    assert meta["modelspec.architecture"] == "chroma/lora"
    assert meta["ss_model_type"] == "chroma"

    model = pipe.transformer
    base = {p: model.get_submodule(p).weight.detach().clone() for m in modules for p in _parts(m)}
    readable = {k: v for k, v in saved.items() if LINEAR1 not in k}
    save_file(readable, str(tmp_path / "readable.safetensors"))
    pipe.load_lora_weights(str(tmp_path / "readable.safetensors"))
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0)
    for module in sorted(m for m in modules if LINEAR1 not in m):
        down, up = saved[f"{module}.lora_down.weight"], saved[f"{module}.lora_up.weight"]
        alpha = saved[f"{module}.alpha"].item()
        delta = alpha / down.shape[0] * (up.float() @ down.float())
        row = 0
        for part in _parts(module):
            layer = model.get_submodule(part)
            fused = getattr(layer, "base_layer", layer).weight.detach()
            rows = fused.shape[0]
            torch.testing.assert_close(fused, base[part] + delta[row : row + rows],
                                       rtol=1e-5, atol=1e-6, msg=part)  # fmt: skip
            row += rows
        assert row == delta.shape[0], module
    pipe.unfuse_lora(components=["transformer"])
    pipe.unload_lora_weights()


def test_full_fine_tune_writes_the_trained_transformer(tmp_path, chroma_dir, images):
    """The file holds the trained transformer in the original names, which diffusers' own
    converter (at the tiny width, as the conformance kit runs it) reads back whole."""
    from diffusers import ChromaTransformer2DModel

    from tests.kits.chroma.kit import _reference_transformer

    out = tmp_path / "out"
    keys = {**CHROMA, "train_mode": "unet", "learning_rate": 1e-4}
    keys.pop("network_module")
    keys.pop("network_train_unet_only")
    config = write_config(tmp_path / "c.toml", chroma_dir, images, out, **keys)
    assert train(config) == 0
    path = out / "run.safetensors"
    saved = tensors(path)
    assert "double_blocks.0.img_attn.qkv.weight" in saved
    assert "distilled_guidance_layer.layers.1.in_layer.weight" in saved
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    model = ChromaTransformer2DModel.from_config(json.loads(meta["difftune.config.transformer"]))
    converted = _reference_transformer(saved, {})
    assert set(converted) == set(model.state_dict())
    base = ChromaTransformer2DModel.from_pretrained(chroma_dir / "transformer")
    changed = [k for k, v in base.state_dict().items() if not torch.equal(v, converted[k])]
    assert changed  # it trained
    # the diffusers folder written beside it holds the same transformer
    trained = ChromaTransformer2DModel.from_pretrained(out / "run" / "transformer")
    for key, value in trained.state_dict().items():
        assert torch.equal(value, converted[key]), key
    # and difftune reads the file back as a model, with the tiny T5 and AE as files
    files = write_tiny_chroma_files(tmp_path / "files")
    flow = FlowSection(t5xxl=str(files["t5xxl"]), ae=str(files["ae"]),
                       t5_tokenizer_path=str(files["t5_tokenizer"]))  # fmt: skip
    model = ModelSection(pretrained_model_name_or_path=str(path))
    reread = load_components(model, torch.float32, flow).denoiser.state_dict()
    assert set(reread) == set(converted)
    for key, value in converted.items():
        assert torch.equal(reread[key], value), key


def test_accumulation_and_resume_train_the_same_lora(tmp_path, chroma_dir, monkeypatch):
    """One batch of 4 (captions of four lengths, T5's mask), 2 x 2 accumulated, and a run
    stopped right after its step-1 save and resumed: the same LoRA."""
    from tests.integration.harness import captioned_images, check_folder_lora_resumes

    captions = [("a shape " + "on a gradient " * i) for i in range(4)]
    images = captioned_images(tmp_path / "imgs", captions)
    run = {**CHROMA, "optimizer_args": ["eps=1e-3"]}
    check_folder_lora_resumes(tmp_path, chroma_dir, images, run, monkeypatch)
