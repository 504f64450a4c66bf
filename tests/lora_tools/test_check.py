"""``lora_tool.py check``: nothing is dropped from our own files by any loader (exit 0); an extra
bogus module or a file of another family is named per loader (exit 1)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from tests.lora_tools.model_helpers import (
    TrainedLora,
    error_lines,
    load,
    model_dir,
    read,
    run_tool,
)

BOGUS = "lora_unet_down_blocks_0_attentions_0_not_a_layer"


@pytest.fixture(scope="module")
def sd1(tmp_path_factory, kit_folders):
    root = tmp_path_factory.mktemp("check")
    base_dir = model_dir("sd1", kit_folders)
    lora = TrainedLora(load(base_dir), rank=4, alpha=2.0, conv=(2, 1.0), seed=31)
    path = lora.save(root / "ours.safetensors", {"ss_base_model_version": "sd_v1"})
    tensors, _ = read(path)
    tensors[f"{BOGUS}.lora_down.weight"] = torch.zeros(4, 32)
    tensors[f"{BOGUS}.lora_up.weight"] = torch.zeros(32, 4)
    tensors[f"{BOGUS}.alpha"] = torch.tensor(4.0)
    bogus = root / "bogus.safetensors"
    save_file(tensors, str(bogus))
    return {"root": root, "base_dir": base_dir, "ours": path, "bogus": bogus}


def _sections(out: str) -> dict[str, str]:
    """The printed report of each loader."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        head = line.split(":", 1)[0]
        if head in ("difftune", "diffusers", "comfyui"):
            current = head
        if current:
            sections.setdefault(current, []).append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def test_our_files_lose_nothing(sd1, capsys):
    assert run_tool("check", "--lora", sd1["ours"], "--model", sd1["base_dir"]) == 0
    sections = _sections(capsys.readouterr().out)
    assert sorted(sections) == ["comfyui", "difftune", "diffusers"]
    for report in sections.values():
        assert "reads all 273 keys" in report


def test_a_bogus_module_is_named_by_every_loader(sd1, capsys):
    assert run_tool("check", "--lora", sd1["bogus"], "--model", sd1["base_dir"]) == 1
    sections = _sections(capsys.readouterr().out)
    for loader, report in sections.items():
        assert "drops 3 of 276 keys" in report, loader
        for suffix in ("lora_down.weight", "lora_up.weight", "alpha"):
            assert f"{BOGUS}.{suffix}" in report, loader
        assert "names no layer of this SD 1.x model" in report, loader


def test_a_file_of_another_family(sd1, tmp_path, kit_folders, capsys):
    sdxl = load(model_dir("sdxl", kit_folders))
    path = TrainedLora(sdxl, rank=2, alpha=2.0, seed=32).save(tmp_path / "sdxl.safetensors")
    code = run_tool("check", "--lora", path, "--model", sd1["base_dir"], "--loader", "difftune")
    assert code == 1
    report = _sections(capsys.readouterr().out)["difftune"]
    assert "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight" in report
    assert "a LoRA for SDXL models" in report
    code = run_tool("check", "--lora", path, "--model", sd1["base_dir"], "--loader", "comfyui")
    assert code == 1
    assert "lora_unet_input_blocks_4_1_proj_in.lora_up.weight" in capsys.readouterr().out


def _in_diffusers_layout(sd1, folder):
    """Our SD file converted to diffusers' layout (with the header save_lora_weights writes)."""
    out = folder / "peft.safetensors"
    code = run_tool(
        "convert", "--input", sd1["ours"], "--model", sd1["base_dir"], "--to", "diffusers",
        "--output", out,
    )  # fmt: skip
    assert code == 0
    return out


def test_diffusers_layout_in_comfyui_and_difftune(sd1, tmp_path, capsys):
    """A diffusers-layout SD file: diffusers reads it, difftune asks for a conversion, and
    ComfyUI's key map has no ``unet.<path>.to_q`` names (it maps ``.processor.to_q``), so it
    drops the attention projections."""
    out = _in_diffusers_layout(sd1, tmp_path)
    capsys.readouterr()
    assert run_tool("check", "--lora", out, "--model", sd1["base_dir"]) == 1
    sections = _sections(capsys.readouterr().out)
    assert "reads all" in sections["diffusers"]
    assert "convert --to kohya" in sections["difftune"]
    comfy = sections["comfyui"]
    assert "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight" in comfy
    assert "unet.down_blocks.0.attentions.0.proj_in.lora_A.weight" not in comfy
    assert "lora_adapter_metadata" in comfy  # the note: ComfyUI ignores diffusers' alphas


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_transformer_families(family, tmp_path, kit_folders, capsys):
    """Our FLUX.1 / SD3 files (fused kohya modules) are read whole by ComfyUI (difftune's
    column is checked for every family in tests/conformance/test_lora_tool_families.py)."""
    base_dir = model_dir(family, kit_folders)
    path = TrainedLora(load(base_dir), rank=2, alpha=2.0, seed=33).save(tmp_path / "t.safetensors")
    assert run_tool("check", "--lora", path, "--model", base_dir, "--loader", "comfyui") == 0
    assert "reads all" in capsys.readouterr().out


def test_refusals(sd1, tmp_path, capsys):
    code = run_tool("check", "--lora", tmp_path / "missing.safetensors", "--model", sd1["base_dir"])
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "missing.safetensors" in line
    code = run_tool("check", "--lora", sd1["ours"], "--model", tmp_path / "nope")
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "--model" in line


@pytest.mark.parametrize("family", ["sdxl", "flux", "sd3"])
def test_lycoris_files_are_read_whole(family, tmp_path, kit_folders, capsys):
    """Our LyCORIS files (LoHa with DoRA; on FLUX.1/SD3 one module per fused original layer)
    lose no key in difftune's import or ComfyUI's key map."""
    from library.networks.lycoris.spec import LycorisSpec

    base_dir = model_dir(family, kit_folders)
    components = load(base_dir)
    spec = LycorisSpec(algo="loha", dim=2, alpha=1.0, dora_wd=True)
    family_obj = components.family
    family_obj.apply_lycoris(components.denoiser, "unet", spec, "full")
    models = {"lora_unet": components.denoiser}
    tensors = family_obj.lora_tensors(models)
    assert any(k.endswith(".hada_w1_a") for k in tensors)
    path = tmp_path / "lycoris.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    for loader in ("difftune", "comfyui"):
        assert run_tool("check", "--lora", path, "--model", base_dir, "--loader", loader) == 0
        assert "reads all" in capsys.readouterr().out


@pytest.mark.parametrize(
    "header, field",
    [("{not json", "is not JSON"), ('{"unet.lora_alpha": "four"}', 'unet.lora_alpha is "four"'),
     ('{"unet.lora_alpha": NaN}', "unet.lora_alpha is nan"), ("[4]", "is a JSON list"),
     ('{"unet.alpha_pattern": {"(": 2}}', "unet.alpha_pattern['(']")],
)  # fmt: skip
def test_a_broken_diffusers_header_is_one_line_in_check_and_convert(
    sd1, tmp_path, capsys, header, field
):
    """diffusers' lora_adapter_metadata header that diffusers would not write: check and
    convert refuse it in one line naming the file and the field, and convert writes nothing
    (it used to write alpha = rank and exit 0)."""
    tensors, metadata = read(_in_diffusers_layout(sd1, tmp_path))
    broken = tmp_path / "broken.safetensors"
    save_file(tensors, str(broken), metadata={**metadata, "lora_adapter_metadata": header})
    capsys.readouterr()
    out = tmp_path / "kohya.safetensors"
    for argv in (
        ["check", "--lora", broken, "--model", sd1["base_dir"]],
        [
            "convert",
            "--input",
            broken,
            "--model",
            sd1["base_dir"],
            "--to",
            "kohya",
            "--output",
            out,
        ],
    ):
        assert run_tool(*argv) == 2, argv
        (line,) = error_lines(capsys.readouterr().err)
        assert f"{broken}: its lora_adapter_metadata header" in line and field in line, line
    assert not out.exists()
