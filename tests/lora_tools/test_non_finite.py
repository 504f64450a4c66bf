"""The toolbox refuses numbers that cannot make a usable file: ratios that are not finite or
absurd, results that overflow the saved dtype, LoRA files holding NaN or inf; ``check`` lists
such tensors as a problem."""

from __future__ import annotations

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

BROKEN = "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight"


@pytest.fixture(scope="module")
def sd1(tmp_path_factory, kit_folders):
    root = tmp_path_factory.mktemp("finite")
    base_dir = model_dir("sd1", kit_folders)
    base = load(base_dir)
    good = TrainedLora(base, rank=4, alpha=2.0, seed=11).save(root / "good.safetensors")
    tensors, metadata = read(good)
    assert BROKEN in tensors
    tensors[BROKEN] = tensors[BROKEN].clone()
    tensors[BROKEN][0, 0] = float("nan")
    nan = root / "nan.safetensors"
    save_file(tensors, str(nan), metadata)
    # large factors: at ratio 100 its changes exceed fp16's range, not fp32's
    big = TrainedLora(base, rank=4, alpha=4.0, seed=12, std=30.0).save(root / "big.safetensors")
    return {"base_dir": base_dir, "good": good, "nan": nan, "big": big}


@pytest.mark.parametrize("ratio", ["nan", "inf", "-inf", "1e30", "100.5"])
def test_merge_refuses_ratios_that_are_not_finite_or_absurd(sd1, ratio, tmp_path, capsys):
    out = tmp_path / "merged.safetensors"
    argv = ["--model", sd1["base_dir"], "--loras", sd1["good"], f"--ratios={ratio}"]
    assert run_tool("merge", *argv, "--output", out) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "--ratios" in line and "from -100 to 100" in line, line
    assert not out.exists()


def test_merge_refuses_a_result_that_overflows_the_saved_dtype(sd1, tmp_path, capsys):
    out = tmp_path / "merged.safetensors"
    argv = ["--model", sd1["base_dir"], "--loras", sd1["big"], "--ratios", "100"]
    assert run_tool("merge", *argv, "--output", out, "--save_precision", "fp16") == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert f"--ratios 100 ({sd1['big']})" in line and "not finite in fp16" in line, line
    assert "--save_precision fp32, which holds it" in line
    assert not out.exists()
    # fp32 holds it: the changes at ratio 100, by hand, exceed fp16's range and not fp32's
    largest = max(d.abs().max() for d in kohya_deltas(read(sd1["big"])[0], 100.0).values())
    assert torch.finfo(torch.float16).max < largest < torch.finfo(torch.float32).max
    assert run_tool("merge", *argv, "--output", out) == 0


def test_a_lora_holding_nan_is_refused_by_every_command_that_computes_with_it(
    sd1, tmp_path, capsys
):
    nan, model = sd1["nan"], sd1["base_dir"]
    out = tmp_path / "out.safetensors"
    commands = [
        ("merge", "--model", model, "--loras", sd1["good"], nan, "--output", out),
        ("merge-loras", "--inputs", sd1["good"], nan, "--output", out),
        ("resize", "--input", nan, "--rank", 2, "--output", out),
        ("convert", "--input", nan, "--model", model, "--to", "diffusers", "--output", out),
    ]
    for argv in commands:
        assert run_tool(*argv) == 2, argv
        (line,) = error_lines(capsys.readouterr().err)
        assert f"{nan}: {BROKEN} holds NaN or infinite values" in line, line
        assert not out.exists()


def test_check_reports_non_finite_tensors(sd1, capsys):
    # ComfyUI reads every key of the file by name: the NaN is the only problem
    argv = ["--model", sd1["base_dir"], "--loader", "comfyui"]
    assert run_tool("check", "--lora", sd1["good"], *argv) == 0
    assert "not finite" not in capsys.readouterr().out
    assert run_tool("check", "--lora", sd1["nan"], *argv) == 1
    out = capsys.readouterr().out
    assert "not finite: 1 of " in out and f"    {BROKEN}" in out
    assert "comfyui: reads all" in out


@pytest.mark.parametrize("alpha", ["inf", "1e39"])
def test_resize_refuses_a_new_alpha_that_is_not_finite(tool, lora_file, tmp_path, alpha):
    out = tmp_path / "out.safetensors"
    argv = ["--input", lora_file, "--rank", 2, f"--new_alpha={alpha}", "--output", out]
    code, _, err = tool("resize", *argv)
    assert code == 2 and "--new_alpha" in err and len(error_lines(err)) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("ratio", ["1e30", "-150"])
def test_merge_loras_refuses_absurd_ratios(tool, make_lora, tmp_path, ratio):
    a, b = make_lora("a.safetensors", seed=1), make_lora("b.safetensors", seed=2)
    out = tmp_path / "out.safetensors"
    code, _, err = tool("merge-loras", "--inputs", a, b, "--ratios", 1, ratio, "--output", out)
    assert code == 2 and "--ratios" in err and "from -100 to 100" in err, err
    assert not out.exists()
