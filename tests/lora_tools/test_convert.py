"""``lora_tool.py convert``: kohya <-> diffusers (peft) <-> ComfyUI layouts, there and back bit
for bit; diffusers' own load_lora_weights reads the diffusers output without unexpected or
missing keys and makes the same change."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.lora_tools.model_helpers import (
    TrainedLora,
    error_lines,
    kohya_deltas,
    load,
    model_dir,
    read,
    run_tool,
)

METADATA = {"ss_network_module": "networks.lora", "ss_output_name": "x", "sshs_model_hash": "?"}


@pytest.fixture(scope="module")
def files(tmp_path_factory, kit_folders):
    """family -> (model folder, kohya LoRA path, the TrainedLora): SD 1.x with LoCon convs and
    alpha != rank, SDXL, FLUX.1 (fused modules)."""
    root = tmp_path_factory.mktemp("convert")
    out = {}
    for family, conv in (("sd1", (2, 1.0)), ("sdxl", None), ("flux", None)):
        base_dir = model_dir(family, kit_folders)
        lora = TrainedLora(load(base_dir), rank=4, alpha=3.0, conv=conv, seed=21, std=0.2)
        out[family] = (base_dir, lora.save(root / f"{family}.safetensors", METADATA), lora)
    return out


def _convert(source, model, to, out, *extra) -> int:
    return run_tool(
        "convert", "--input", source, "--model", model, "--to", to, "--output", out, *extra
    )


def _same(first, second) -> None:
    """Bit-identical tensors (values and dtypes) and identical metadata."""
    a, meta_a = read(first)
    b, meta_b = read(second)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert torch.equal(
            a[key].reshape(-1).view(torch.uint8), b[key].reshape(-1).view(torch.uint8)
        ), key
    assert meta_a == meta_b


# every family's own file there and back: tests/conformance/test_lora_tool_families.py; here
# SD's with LoCon convs, alpha != rank and a kohya header (metadata and hashes kept)
@pytest.mark.parametrize("family", ["sd1", "sdxl"])
@pytest.mark.parametrize("layout", ["diffusers", "comfyui"])
def test_there_and_back_is_bit_identical(files, family, layout, tmp_path):
    model, path, _ = files[family]
    there, back = tmp_path / "there.safetensors", tmp_path / "back.safetensors"
    assert _convert(path, model, layout, there) == 0
    assert _convert(there, model, "kohya", back) == 0
    _same(path, back)
    tensors, _ = read(there)
    heads = ("unet.", "text_encoder")
    if layout == "comfyui":
        heads = ("diffusion_model.", "text_encoders.")
    assert all(key.startswith(heads) for key in tensors)
    if layout == "comfyui" and family == "sd1":  # the LDM names ComfyUI's own nodes write
        assert "diffusion_model.input_blocks.1.1.proj_in.lora_up.weight" in tensors
        assert (
            "text_encoders.clip_l.transformer.text_model.encoder.layers.0.mlp.fc1.alpha" in tensors
        )


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_diffusers_reads_the_diffusers_layout(files, family, tmp_path):
    """load_lora_weights takes every key (no warning about unexpected or missing keys) and the
    adapters make the file's change, alpha / r included (from the lora_adapter_metadata header)."""
    from library.lora_tools.base_model import layer_table
    from tests.lora_tools.model_helpers import module_of
    from tests.networks.lora_load_helpers import load_quietly, peft_layers

    model, path, lora = files[family]
    out = tmp_path / "diffusers.safetensors"
    assert _convert(path, model, "diffusers", out) == 0
    components = load(model)
    pipe = _pipeline(components)
    noise = load_quietly(pipe, out)
    assert not noise, noise
    adapted = peft_layers(pipe.unet) + peft_layers(pipe.text_encoder)
    if family == "sdxl":
        adapted += peft_layers(pipe.text_encoder_2)
    assert len(adapted) == len(lora.deltas)
    for (role, path_), delta in lora.deltas.items():
        layer = module_of(components, role, path_)
        got = layer.get_delta_weight("default_0").double()
        torch.testing.assert_close(got.reshape(delta.shape), delta, rtol=1e-4, atol=1e-6, msg=path_)
    _, header = read(out)
    config = json.loads(header["lora_adapter_metadata"])
    assert config["unet.lora_alpha"] == 3.0 and config["unet.r"] == 4
    assert len(layer_table(components)) > len(lora.deltas)


def _pipeline(components):
    from library.lora_tools.check_diffusers import loaded_pipeline

    return loaded_pipeline(components)


def test_fold_alpha_gives_the_same_change_without_a_header(files, tmp_path):
    model, path, lora = files["sd1"]
    folded, back = tmp_path / "folded.safetensors", tmp_path / "back.safetensors"
    assert _convert(path, model, "diffusers", folded, "--fold_alpha") == 0
    _, header = read(folded)
    assert "lora_adapter_metadata" not in header
    assert _convert(folded, model, "kohya", back) == 0
    tensors, _ = read(back)
    want, got = kohya_deltas(lora.tensors), kohya_deltas(tensors)
    assert sorted(want) == sorted(got)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7)
        assert float(tensors[f"{name}.alpha"]) == tensors[f"{name}.lora_down.weight"].shape[0]


def test_flux_fused_modules_split_into_diffusers_linears(files, tmp_path):
    model, path, _ = files["flux"]
    out = tmp_path / "flux_diffusers.safetensors"
    assert _convert(path, model, "diffusers", out) == 0
    tensors, _ = read(out)
    kohya, _ = read(path)
    fused = kohya["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"]
    parts = [tensors[f"transformer.transformer_blocks.0.attn.to_{p}.lora_A.weight"] for p in "qkv"]
    assert torch.equal(torch.cat(parts), fused)  # the parts' downs are the fused module's rows


def test_refusals(files, tmp_path, capsys):
    model, path, _ = files["sd1"]
    out = tmp_path / "out.safetensors"
    assert _convert(path, model, "kohya", out) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "already in the kohya layout" in line
    sdxl_model, sdxl_lora, _ = files["sdxl"]
    assert _convert(sdxl_lora, model, "comfyui", out) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "SDXL" in line and not out.exists()
    assert _convert(path, tmp_path / "missing", "diffusers", out) == 2
    assert "--model" in error_lines(capsys.readouterr().err)[0]
    out.write_bytes(b"keep")
    assert _convert(path, model, "diffusers", out) == 2
    assert "--overwrite" in error_lines(capsys.readouterr().err)[0]
    assert out.read_bytes() == b"keep"


def test_text_encoder_modules_without_a_place_are_refused_by_name(tmp_path, capsys):
    """A Z-Image file with a module of its Qwen3 text encoder (no Z-Image LoRA adapts it): the
    diffusers layout (ZImagePipeline loads LoRA weights into the transformer only) and
    ComfyUI's (whose Qwen3 names are not reproduced) refuse it in one line naming the family,
    instead of writing a name no loader reads."""
    from library.lora_tools.base_model import layer_table
    from tests.kits.zimage.tiny import write_tiny_zimage_folder

    folder = write_tiny_zimage_folder(tmp_path / "tiny-zimage")
    table = layer_table(load(folder))
    name, layer = next((n, la) for n, la in table.items() if n.startswith("lora_te_"))
    rows, cols = layer.shape
    tensors = {
        f"{name}.lora_down.weight": torch.randn(2, cols),
        f"{name}.lora_up.weight": torch.randn(rows, 2),
        f"{name}.alpha": torch.tensor(2.0),
    }
    path = tmp_path / "te.safetensors"
    save_file(tensors, str(path))
    for layout in ("diffusers", "comfyui"):
        out = tmp_path / f"{layout}.safetensors"
        capsys.readouterr()
        assert _convert(path, folder, layout, out) == 2, layout
        (line,) = error_lines(capsys.readouterr().err)
        assert name in line and "Z-Image" in line and not out.exists(), line


def test_comfyui_names_with_peft_tensors_read_at_scale_one(files, tmp_path):
    """ComfyUI reads lora_A / lora_B under its diffusion_model. names too, at scale 1 (no
    alpha): such a file converts to kohya's lora_down / lora_up with alpha = rank, the same
    change."""
    model, path, _ = files["flux"]
    there = tmp_path / "comfy.safetensors"
    assert _convert(path, model, "comfyui", there) == 0
    tensors, metadata = read(there)
    peft = {}
    for key, value in tensors.items():
        module, _, suffix = key.partition(".lora_")
        if key.endswith(".alpha"):
            continue
        if suffix == "up.weight":
            scale = float(tensors[f"{module}.alpha"]) / value.shape[1]
            peft[f"{module}.lora_B.weight"] = value * scale
        else:
            peft[f"{module}.lora_A.weight"] = value
    save_file(peft, str(tmp_path / "peft.safetensors"), metadata)
    back = tmp_path / "back.safetensors"
    assert _convert(tmp_path / "peft.safetensors", model, "kohya", back) == 0
    want, got = kohya_deltas(read(path)[0]), kohya_deltas(read(back)[0])
    assert sorted(got) == sorted(want)
    for name, delta in want.items():
        torch.testing.assert_close(got[name], delta, rtol=1e-5, atol=1e-7, msg=name)
