"""lora_tool.py resize: lossless at full rank, the best approximation at lower ranks, the
dynamic rank rules, metadata, and the files it refuses."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.lora_tools.lora_files import BASE_MODULES, module_tensors, save

TOL = 1e-5  # relative, float32 factors


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> bool:
    return float((a - b).norm()) <= tol * max(float(b.norm()), 1e-12)


def _spec_rank(name: str) -> int:
    return len(BASE_MODULES[name][3])


def test_full_rank_is_lossless(tool, lora_file, tmp_path, deltas, read_file):
    out = tmp_path / "full.safetensors"
    code, stdout, err = tool("resize", "--input", lora_file, "--rank", 64, "--output", out)
    assert code == 0, err
    before, after = deltas(lora_file), deltas(out)
    assert sorted(after) == sorted(before) == sorted(BASE_MODULES)
    tensors, _ = read_file(out)
    for name, delta in before.items():
        assert _close(after[name], delta), name
        # a rank never grows: the ceiling 64 leaves each module its own rank
        assert tensors[f"{name}.lora_down.weight"].shape[0] == _spec_rank(name)
    conv = "lora_unet_down_blocks_0_resnets_0_conv1"
    assert tuple(tensors[f"{conv}.lora_down.weight"].shape) == (6, 5, 3, 3)
    assert tuple(tensors[f"{conv}.lora_up.weight"].shape) == (7, 6, 1, 1)
    one_by_one = "lora_unet_mid_block_attentions_0_proj_in"
    assert tuple(tensors[f"{one_by_one}.lora_up.weight"].shape) == (20, 8, 1, 1)
    assert "resized 4 modules" in stdout and "mean 100.00%" in stdout


def test_rank_k_is_the_best_rank_k_approximation(tool, lora_file, tmp_path, deltas, read_file):
    out = tmp_path / "r3.safetensors"
    code, _, err = tool(
        "resize", "--input", lora_file, "--rank", 3, "--conv_rank", 2, "--output", out
    )
    assert code == 0, err
    before, after = deltas(lora_file), deltas(out)
    tensors, _ = read_file(out)
    for name, delta in before.items():
        k = 2 if name.endswith("conv1") else 3
        assert tensors[f"{name}.lora_down.weight"].shape[0] == k
        values = torch.linalg.svdvals(delta)
        best_error = math.sqrt(float(values[k:].square().sum()))
        error = float((after[name] - delta).norm())
        assert error == pytest.approx(best_error, rel=1e-4), name
        # and it is that approximation, not another one with the same error
        u, s, vh = torch.linalg.svd(delta, full_matrices=False)
        assert _close(after[name], u[:, :k] @ torch.diag(s[:k]) @ vh[:k], 1e-4), name
        # alpha / rank is kept (sd-scripts' default alpha)
        old_alpha = BASE_MODULES[name][4] or _spec_rank(name)
        assert tensors[f"{name}.alpha"].item() == pytest.approx(old_alpha / _spec_rank(name) * k)


def _expected_rank(values: torch.Tensor, method: str, param: float) -> int:
    """The dynamic rules, from the singular values of the dense delta (written out plainly)."""
    values = [float(v) for v in values]
    if method == "sv_ratio":
        return max(1, sum(1 for v in values if v > values[0] / param))
    if method == "sv_fro":
        total, running = sum(v * v for v in values), 0.0
        for k, v in enumerate(values, 1):
            running += v * v
            if math.sqrt(running / total) >= param:
                return k
    if method == "sv_cumulative":
        total, running = sum(values), 0.0
        for k, v in enumerate(values, 1):
            running += v
            if running / total >= param:
                return k
    raise AssertionError(method)


@pytest.mark.parametrize(
    ("method", "param", "ceiling"),
    [
        ("sv_ratio", 4.0, None),
        ("sv_fro", 0.9, None),
        ("sv_cumulative", 0.85, None),
        ("sv_ratio", 40.0, 3),
    ],
)
def test_dynamic_methods_choose_the_ranks_of_their_rules(
    tool, lora_file, tmp_path, deltas, read_file, method, param, ceiling
):
    out = tmp_path / "dynamic.safetensors"
    extra = [] if ceiling is None else ["--rank", ceiling]
    code, stdout, err = tool(
        "resize", "--input", lora_file, "--dynamic_method", method, "--dynamic_param", param,
        *extra, "--output", out, "--verbose",
    )  # fmt: skip
    assert code == 0, err
    tensors, metadata = read_file(out)
    before, after = deltas(lora_file), deltas(out)
    chosen = {}
    for name, delta in before.items():
        values = torch.linalg.svdvals(delta)
        expected = _expected_rank(values, method, param)
        if ceiling is not None:
            expected = min(expected, ceiling)
        chosen[name] = tensors[f"{name}.lora_down.weight"].shape[0]
        assert chosen[name] == expected, (name, [round(float(v), 3) for v in values[:8]])
        best_error = math.sqrt(float(values[expected:].square().sum()))
        assert float((after[name] - delta).norm()) == pytest.approx(best_error, rel=1e-4, abs=1e-6)
        assert f"-> {expected} " in next(line for line in stdout.splitlines() if name in line)
    if ceiling is None:
        assert len(set(chosen.values())) > 1  # the fixture's modules do get different ranks
    else:  # and the ceiling did cut some module
        assert any(
            _expected_rank(torch.linalg.svdvals(d), method, param) > ceiling
            for d in before.values()
        )
    assert metadata["ss_network_dim"] == metadata["ss_network_alpha"] == "Dynamic"
    assert json.loads(metadata["ss_network_args"])["conv_dim"] == "Dynamic"
    assert metadata["ss_training_comment"].startswith(
        f"resized by lora_tool.py resize with {method}"
    )


def test_metadata_of_a_fixed_resize(tool, lora_file, tmp_path, read_file):
    out = tmp_path / "r2.safetensors"
    code, _, err = tool("resize", "--input", lora_file, "--rank", 2, "--output", out)
    assert code == 0, err
    _, before = read_file(lora_file)
    _, after = read_file(out)
    # alphas: 4/8*2, 8/8*2 (no alpha key), 16/8*2 for the Linear and 1x1 modules -> differ
    assert after["ss_network_dim"] == "2"
    assert after["ss_network_alpha"] == "Dynamic"
    assert json.loads(after["ss_network_args"]) == {"conv_dim": "2", "conv_alpha": "0.3333333"}
    assert after["ss_training_comment"] == (
        "rank resized by lora_tool.py resize from 8 to 2 (conv: 6 to 2); fixture run"
    )
    for key in ("ss_tag_frequency", "ss_base_model_version", "modelspec.title", "ss_output_name"):
        assert after[key] == before[key]
    assert "ss_session_id" not in after  # not the training run's own file any more
    assert after["sshs_model_hash"] not in ("stale", before["sshs_model_hash"])
    assert len(after["sshs_model_hash"]) == 64


def test_new_alpha_is_written_and_folded_into_the_weights(
    tool, lora_file, tmp_path, deltas, read_file
):
    out = tmp_path / "alpha.safetensors"
    code, _, err = tool(
        "resize", "--input", lora_file, "--rank", 8, "--new_alpha", 1, "--output", out,
        "--save_precision", "fp32",
    )  # fmt: skip
    assert code == 0, err
    tensors, metadata = read_file(out)
    assert {tensors[f"{name}.alpha"].item() for name in BASE_MODULES} == {1.0}
    before, after = deltas(lora_file), deltas(out)
    for name, delta in before.items():
        assert _close(after[name], delta), name
    assert metadata["ss_network_alpha"] == "1.0"


def test_fp16_output_and_up_down_balance(tool, lora_file, tmp_path, read_file, deltas):
    out = tmp_path / "half.safetensors"
    code, _, err = tool(
        "resize", "--input", lora_file, "--rank", 4, "--save_precision", "fp16", "--output", out
    )
    assert code == 0, err
    tensors, _ = read_file(out)
    name = "lora_te_text_model_encoder_layers_0_mlp_fc1"
    assert tensors[f"{name}.lora_down.weight"].dtype == torch.float16
    assert tensors[f"{name}.alpha"].dtype == torch.float32
    up, down = (
        tensors[f"{name}.lora_up.weight"].float(),
        tensors[f"{name}.lora_down.weight"].float(),
    )
    # singular values split evenly: each side's column/row norms are sqrt(s)
    assert torch.allclose(up.norm(dim=0), down.norm(dim=1), rtol=1e-2)


def test_zero_module_keeps_rank_one(tool, tmp_path, read_file):
    tensors = module_tensors("lora_unet_a", (6, 4, None, [1.0, 0.5], 2.0))
    tensors["lora_unet_a.lora_up.weight"].zero_()
    source = save(tmp_path / "zero.safetensors", tensors, {})
    out = tmp_path / "zero_out.safetensors"
    code, _, err = tool(
        "resize", "--input", source, "--dynamic_method", "sv_fro", "--dynamic_param", 0.5,
        "--output", out,
    )  # fmt: skip
    assert code == 0, err
    result, _ = read_file(out)
    assert result["lora_unet_a.lora_down.weight"].shape[0] == 1
    assert float(result["lora_unet_a.lora_up.weight"].abs().sum()) == 0.0


@pytest.mark.parametrize(
    ("keys", "word"),
    [
        (
            {"hada_w1_a": [4, 2], "hada_w1_b": [2, 6], "hada_w2_a": [4, 2], "hada_w2_b": [2, 6]},
            "LoHa",
        ),
        ({"lokr_w1": [2, 2], "lokr_w2": [2, 3]}, "LoKr"),
    ],
)
def test_lycoris_input_is_refused(tool, tmp_path, error_line, keys, word):
    tensors = {f"lora_unet_x.{k}": torch.randn(shape) for k, shape in keys.items()}
    source = save(tmp_path / "lycoris.safetensors", tensors, {})
    out = tmp_path / "out.safetensors"
    code, _, err = tool("resize", "--input", source, "--rank", 2, "--output", out)
    assert code == 2
    line = error_line(err)
    assert str(source) in line and word in line and "no rank to truncate" in line
    assert not out.exists()


def test_dora_input_is_refused(tool, tmp_path, error_line):
    tensors = module_tensors("lora_unet_x", (6, 4, None, [1.0, 0.5], 2.0))
    tensors["lora_unet_x.dora_scale"] = torch.ones(1, 4)
    source = save(tmp_path / "dora.safetensors", tensors, {})
    code, _, err = tool(
        "resize", "--input", source, "--rank", 1, "--output", tmp_path / "o.safetensors"
    )
    assert code == 2
    line = error_line(err)
    assert "DoRA" in line and "base model" in line and str(source) in line


def test_missing_and_corrupt_inputs(tool, lora_file, tmp_path, error_line):
    out = tmp_path / "out.safetensors"
    missing = tmp_path / "nope.safetensors"
    code, _, err = tool("resize", "--input", missing, "--rank", 2, "--output", out)
    assert code == 2 and str(missing) in error_line(err) and "not found" in err
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(lora_file.read_bytes()[:-100])
    code, _, err = tool("resize", "--input", corrupt, "--rank", 2, "--output", out)
    assert code == 2 and str(corrupt) in error_line(err)
    assert not out.exists()


def test_existing_output_is_not_replaced(tool, lora_file, tmp_path, error_line):
    out = tmp_path / "taken.safetensors"
    out.write_bytes(b"keep me")
    code, _, err = tool("resize", "--input", lora_file, "--rank", 2, "--output", out)
    assert code == 2 and "--output" in error_line(err) and "--overwrite" in err
    assert out.read_bytes() == b"keep me"
    code, _, err = tool("resize", "--input", lora_file, "--rank", 2, "--output", out, "--overwrite")
    assert code == 0, err
    assert out.read_bytes() != b"keep me"
    # the input itself is never an output, even with --overwrite
    code, _, err = tool(
        "resize", "--input", lora_file, "--rank", 2, "--output", lora_file, "--overwrite"
    )
    assert code == 2 and "input" in error_line(err)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        ([], "--rank"),
        (["--rank", 0], "--rank"),
        (["--dynamic_method", "sv_fro"], "--dynamic_param"),
        (["--dynamic_method", "sv_fro", "--dynamic_param", 1.5], "--dynamic_param"),
        (["--dynamic_method", "sv_ratio", "--dynamic_param", 0.5], "--dynamic_param"),
        (["--rank", 2, "--dynamic_param", 0.5], "--dynamic_param"),
        (["--rank", 2, "--new_alpha", 0], "--new_alpha"),
        (["--rank", 2, "--device", "nonsense"], "--device"),
    ],
)
def test_bad_options(tool, lora_file, tmp_path, error_line, argv, option):
    out = tmp_path / "out.safetensors"
    code, _, err = tool("resize", "--input", lora_file, *argv, "--output", out)
    assert code == 2
    assert option in error_line(err)
    assert not out.exists()
