"""The exporter's original layout, checked against hand-written facts of that layout."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from library.models.families.sd.checkpoint_layout import LAYOUTS
from library.models.families.sd.family import SD1, SD2_V
from library.saving.checkpoint_export import (
    ensure_text_model_layout,
    export_full_unet_checkpoint,
    text_tensors,
    write_single_file,
    write_text_encoder_folder,
)
from tests.kits.sd.tiny import build_tiny_components, tiny_text_config


@pytest.fixture(scope="module")
def sd1():
    parts = build_tiny_components("sd1", seed=0)
    parts.pop("scheduler")
    return parts


def clip(with_projection: bool = False, family: str = "sd1", seed: int = 0):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    if with_projection:
        return CLIPTextModelWithProjection(
            CLIPTextConfig(**tiny_text_config(family), projection_dim=16)
        )
    return CLIPTextModel(CLIPTextConfig(**tiny_text_config(family)))


def flat(module) -> dict[str, torch.Tensor]:
    """transformers 5's own names, without the text_model. prefix, whatever the class."""
    return {k.removeprefix("text_model."): v for k, v in module.state_dict().items()}


def test_sd1_file_layout(sd1, tmp_path):
    path = write_single_file(
        tmp_path / "m.safetensors", sd1["unet"], sd1["vae"], [sd1["text_encoder"]], SD1,
        torch.float16, {"ss_note": "x"},
    )  # fmt: skip
    tensors = load_file(path)
    assert all(t.dtype == torch.float16 for t in tensors.values())
    groups = {p: [k for k in tensors if k.startswith(p)] for p in (
        "model.diffusion_model.", "first_stage_model.", "cond_stage_model.transformer.text_model."
    )}  # fmt: skip
    assert sum(map(len, groups.values())) == len(tensors)
    te = flat(sd1["text_encoder"])
    prefix = "cond_stage_model.transformer.text_model."
    assert set(groups[prefix]) == {prefix + k for k in te}
    assert torch.equal(
        tensors[prefix + "final_layer_norm.weight"], te["final_layer_norm.weight"].half()
    )
    unet = sd1["unet"].state_dict()
    name = "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"
    assert torch.equal(tensors[name], unet["down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"].half())  # fmt: skip
    assert torch.equal(tensors["model.diffusion_model.out.2.bias"], unet["conv_out.bias"].half())
    q = sd1["vae"].state_dict()["decoder.mid_block.attentions.0.to_q.weight"]
    attn = tensors["first_stage_model.decoder.mid.attn_1.q.weight"]
    assert attn.shape == (*q.shape, 1, 1) and torch.equal(attn[:, :, 0, 0], q.half())
    metadata = safe_open(str(path), "pt").metadata()
    assert metadata["ss_note"] == "x" and metadata["modelspec.prediction_type"] == "epsilon"
    assert json.loads(metadata["difftune.config.unet"])["block_out_channels"] == [32, 64]


def test_sd2_openclip_layout():
    encoder = clip(family="sd2")
    (tower,) = LAYOUTS["sd2"].towers
    tensors = {k.removeprefix(tower.prefix): v for k, v in text_tensors(encoder, tower).items()}
    te = flat(encoder)
    layer = "encoder.layers.1.self_attn."
    fused = torch.cat([te[layer + f"{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(tensors["transformer.resblocks.1.attn.in_proj_weight"], fused)
    assert torch.equal(tensors["transformer.resblocks.1.mlp.c_proj.bias"], te["encoder.layers.1.mlp.fc2.bias"])  # fmt: skip
    assert torch.equal(tensors["positional_embedding"], te["embeddings.position_embedding.weight"])
    assert torch.equal(tensors["ln_final.weight"], te["final_layer_norm.weight"])
    # Two encoder layers -> three blocks: the third, never run, is a copy of the second.
    blocks = {k.split(".")[2] for k in tensors if k.startswith("transformer.resblocks.")}
    assert blocks == {"0", "1", "2"}
    for key in [k for k in tensors if k.startswith("transformer.resblocks.2.")]:
        assert torch.equal(tensors[key], tensors[key.replace(".2.", ".1.", 1)])
    assert "text_projection" not in tensors
    # 12 tensors per block plus token and position embeddings and ln_final.
    assert len(tensors) == 3 * 12 + 4


def test_sdxl_text_towers():
    first, second = LAYOUTS["sdxl"].towers
    one, two = clip(), clip(with_projection=True, family="sd2", seed=1)
    a = text_tensors(one, first)
    assert set(a) == {"conditioner.embedders.0.transformer.text_model." + k for k in flat(one)}
    b = text_tensors(two, second)
    projection = b["conditioner.embedders.1.model.text_projection"]
    assert torch.equal(projection, two.text_projection.weight.t())  # [width, embed]
    assert not any(".resblocks.2." in k for k in b)  # SDXL's bigG keeps exactly its blocks


def test_full_unet_export_takes_trained_unet_and_base_parts(sd1, tmp_path):
    trained = build_tiny_components("sd1", seed=1)["unet"]
    base = SimpleNamespace(vae=sd1["vae"], text_encoders=(sd1["text_encoder"],))
    path = export_full_unet_checkpoint(
        tmp_path / "ft.safetensors", trained, base, SD2_V, torch.float32, {"modelspec.prediction_type": "v"}
    )  # fmt: skip
    tensors = load_file(path)
    key = "model.diffusion_model.middle_block.1.proj_in.weight"
    assert torch.equal(tensors[key], trained.state_dict()["mid_block.attentions.0.proj_in.weight"])
    assert not torch.equal(tensors[key], sd1["unet"].state_dict()["mid_block.attentions.0.proj_in.weight"])  # fmt: skip
    vae = sd1["vae"].state_dict()
    assert torch.equal(tensors["first_stage_model.encoder.conv_in.weight"], vae["encoder.conv_in.weight"])  # fmt: skip
    assert any(k.startswith("cond_stage_model.model.transformer.resblocks.") for k in tensors)
    assert safe_open(str(path), "pt").metadata()["modelspec.prediction_type"] == "v"


def test_family_and_encoder_count_must_match(sd1, tmp_path):
    xl = dataclasses.replace(SD1, text_encoder_subfolders=("text_encoder", "text_encoder_2"))
    with pytest.raises(ValueError, match="2 text encoders"):
        write_single_file(
            tmp_path / "x.safetensors", sd1["unet"], sd1["vae"], [sd1["text_encoder"]], xl,
            torch.float32,
        )  # fmt: skip


@pytest.mark.parametrize("with_projection", [False, True])
def test_text_encoder_folder_uses_the_text_model_layout(tmp_path, with_projection):
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    encoder = clip(with_projection)
    folder = write_text_encoder_folder(encoder, tmp_path / "text_encoder")
    saved = load_file(folder / "model.safetensors")
    expected = {"text_model." + k for k in flat(encoder)}
    if with_projection:
        expected = (expected - {"text_model.text_projection.weight"}) | {"text_projection.weight"}
    assert set(saved) == expected
    cls = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    loaded = cls.from_pretrained(str(folder), local_files_only=True)
    a, b = encoder.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_copied_text_encoder_folder_is_rewritten_in_place(tiny_model_dir, tmp_path):
    from transformers import CLIPTextModel

    folder = Path(shutil.copytree(Path(tiny_model_dir) / "text_encoder", tmp_path / "te"))
    before = load_file(folder / "model.safetensors")
    assert not any(k.startswith("text_model.") for k in before)  # transformers 5 wrote it flat
    assert ensure_text_model_layout(folder) == [folder / "model.safetensors"]
    after = load_file(folder / "model.safetensors")
    assert set(after) == {"text_model." + k for k in before}
    assert all(torch.equal(after["text_model." + k], v) for k, v in before.items())
    assert ensure_text_model_layout(folder) == []
    loaded = CLIPTextModel.from_pretrained(str(folder), local_files_only=True).state_dict()
    assert loaded.keys() == before.keys() and all(torch.equal(loaded[k], before[k]) for k in before)


def test_t5_folders_keep_their_keys(tmp_path):
    """FLUX.1's and SD3's T5 folders are copied as they are: T5 has no text_model. layout, and a
    prefix there makes transformers re-initialise the encoder."""
    from transformers import T5Config, T5EncoderModel

    from tests.kits.flux.tiny_shapes import tiny_t5_config

    folder = tmp_path / "text_encoder_2"
    folder.mkdir()
    t5 = T5EncoderModel(T5Config(**tiny_t5_config()))
    t5.config.to_json_file(str(folder / "config.json"))
    save_file({k: v.clone() for k, v in t5.state_dict().items()}, folder / "model.safetensors")
    before = load_file(folder / "model.safetensors")
    assert ensure_text_model_layout(folder) == []
    after = load_file(folder / "model.safetensors")
    assert after.keys() == before.keys()
