"""lora_tool.py merge-loras: concat and full-rank svd reproduce sum(ratio_i * delta_i), svd at
rank k is the best rank-k approximation of that sum, and the inputs it refuses."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.lora_tools.lora_files import BASE_METADATA, BASE_MODULES, module_tensors, save

TE = "lora_te_text_model_encoder_layers_0_mlp_fc1"
CONV = "lora_unet_down_blocks_0_resnets_0_conv1"
ONLY_B = "lora_unet_up_blocks_1_attentions_0_proj_out"


def _close(a, b, tol=1e-5):
    return float((a - b).norm()) <= tol * max(float(b.norm()), 1e-12)


@pytest.fixture
def pair(make_lora):
    """Two files: B has the modules of A with other ranks/alphas/values (same shapes), lacks
    one of A's modules, and has one of its own."""
    b_modules = {}
    for index, (name, (out, inp, kernel, values, _)) in enumerate(BASE_MODULES.items()):
        if name == "lora_unet_double_blocks_0_img_attn_qkv":
            continue
        b_modules[name] = (out, inp, kernel, [v * (1 + index) for v in values[:4]], 2.0)
    b_modules[ONLY_B] = (10, 6, None, [2.0, 1.0, 0.5], None)
    a = make_lora("a.safetensors", seed=1)
    b = make_lora("b.safetensors", modules=b_modules, seed=2)
    return a, b


def _expected_sum(deltas, paths, ratios):
    total = {}
    for path, ratio in zip(paths, ratios, strict=True):
        for name, delta in deltas(path).items():
            total[name] = total.get(name, 0) + ratio * delta
    return total


def test_concat_reproduces_the_weighted_sum(tool, pair, tmp_path, deltas, read_file):
    out = tmp_path / "concat.safetensors"
    code, stdout, err = tool(
        "merge-loras", "--inputs", *pair, "--ratios", 0.7, -0.4, "--output", out
    )  # fmt: skip
    assert code == 0, err
    expected = _expected_sum(deltas, pair, [0.7, -0.4])
    merged = deltas(out)
    assert sorted(merged) == sorted(expected)
    for name, delta in expected.items():
        assert _close(merged[name], delta), name
    tensors, metadata = read_file(out)
    # ranks are stacked; alpha = rank, the inputs' alpha / r and ratios live in the weights
    assert tensors[f"{TE}.lora_down.weight"].shape[0] == 8 + 4
    assert tensors[f"{TE}.alpha"].item() == 12.0
    assert tuple(tensors[f"{CONV}.lora_down.weight"].shape) == (10, 5, 3, 3)
    assert tuple(tensors[f"{CONV}.lora_up.weight"].shape) == (7, 10, 1, 1)
    assert tensors[f"{ONLY_B}.lora_down.weight"].shape[0] == 3
    assert "(2 of them not in every input)" in stdout
    assert metadata["modelspec.merged_from"] == "fixture, fixture"
    assert metadata["ss_base_model_version"] == "sd_v1"
    assert metadata["ss_network_module"] == "networks.lora"
    assert "merge-loras (concat)" in metadata["ss_training_comment"]
    assert "a.safetensors x0.7, b.safetensors x-0.4" in metadata["ss_training_comment"]
    assert json.loads(metadata["ss_network_args"]) == {"conv_dim": "10", "conv_alpha": "10.0"}
    assert "ss_tag_frequency" not in metadata and "ss_session_id" not in metadata


def test_default_ratios_are_one(tool, pair, tmp_path, deltas):
    out = tmp_path / "ones.safetensors"
    code, _, err = tool("merge-loras", "--inputs", *pair, "--output", out)
    assert code == 0, err
    expected = _expected_sum(deltas, pair, [1.0, 1.0])
    merged = deltas(out)
    for name, delta in expected.items():
        assert _close(merged[name], delta), name


def test_svd_at_full_rank_reproduces_the_sum(tool, pair, tmp_path, deltas):
    out = tmp_path / "svd_full.safetensors"
    code, _, err = tool(
        "merge-loras", "--inputs", *pair, "--ratios", 1.0, 0.5, "--method", "svd",
        "--rank", 64, "--output", out,
    )  # fmt: skip
    assert code == 0, err
    expected = _expected_sum(deltas, pair, [1.0, 0.5])
    merged = deltas(out)
    for name, delta in expected.items():
        assert _close(merged[name], delta), name


def test_svd_at_rank_k_is_the_best_approximation_of_the_sum(
    tool, pair, tmp_path, deltas, read_file
):
    out = tmp_path / "svd3.safetensors"
    code, stdout, err = tool(
        "merge-loras", "--inputs", *pair, "--ratios", 1.0, 0.5, "--method", "svd",
        "--rank", 3, "--conv_rank", 2, "--output", out,
    )  # fmt: skip
    assert code == 0, err
    expected = _expected_sum(deltas, pair, [1.0, 0.5])
    merged = deltas(out)
    tensors, metadata = read_file(out)
    for name, delta in expected.items():
        k = 2 if name == CONV else 3
        assert tensors[f"{name}.lora_down.weight"].shape[0] == k
        assert tensors[f"{name}.alpha"].item() == k
        values = torch.linalg.svdvals(delta)
        best = math.sqrt(float(values[k:].square().sum()))
        noise = 1e-6 * float(delta.norm())  # ONLY_B has rank 3: k is its full rank
        error = float((merged[name] - delta).norm())
        assert error == pytest.approx(best, rel=1e-4, abs=noise), name
        u, s, vh = torch.linalg.svd(delta, full_matrices=False)
        assert _close(merged[name], u[:, :k] @ torch.diag(s[:k]) @ vh[:k], 1e-4), name
    assert metadata["ss_network_dim"] == "3" and metadata["ss_network_alpha"] == "3.0"
    assert json.loads(metadata["ss_network_args"]) == {"conv_dim": "2", "conv_alpha": "2.0"}
    assert "Frobenius norm of the sum kept" in stdout


def test_shape_mismatch_names_both_files_and_the_module(tool, make_lora, tmp_path, error_line):
    a = make_lora("a.safetensors")
    other = dict(BASE_MODULES)
    out_, inp, kernel, values, alpha = other[TE]
    other[TE] = (out_ + 1, inp, kernel, values, alpha)
    b = make_lora("b.safetensors", modules=other)
    out = tmp_path / "out.safetensors"
    code, _, err = tool("merge-loras", "--inputs", a, b, "--output", out)
    assert code == 2
    line = error_line(err)
    assert str(a) in line and str(b) in line and TE in line
    assert not out.exists()


def test_lycoris_input_is_refused(tool, make_lora, tmp_path, error_line):
    a = make_lora("a.safetensors")
    loha = {f"{TE}.hada_w1_a": torch.randn(24, 2), f"{TE}.hada_w1_b": torch.randn(2, 16)}
    loha.update({f"{TE}.hada_w2_a": torch.randn(24, 2), f"{TE}.hada_w2_b": torch.randn(2, 16)})
    b = save(tmp_path / "loha.safetensors", loha, {})
    code, _, err = tool("merge-loras", "--inputs", a, b, "--output", tmp_path / "o.safetensors")
    assert code == 2
    line = error_line(err)
    assert str(b) in line and "LoHa" in line


def test_different_base_models_need_force(tool, make_lora, tmp_path, error_line, read_file):
    a = make_lora("a.safetensors")
    b = make_lora("b.safetensors", metadata={**BASE_METADATA, "ss_base_model_version": "sd_v2"})
    out = tmp_path / "out.safetensors"
    code, _, err = tool("merge-loras", "--inputs", a, b, "--output", out)
    assert code == 2
    line = error_line(err)
    assert str(a) in line and str(b) in line and "sd_v2" in line and "--force" in line
    assert not out.exists()
    code, _, err = tool("merge-loras", "--inputs", a, b, "--output", out, "--force")
    assert code == 0, err
    assert read_file(out)[1]["ss_base_model_version"] == "sd_v1"


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--ratios", 1.0], "--ratios"),
        (["--ratios", 1.0, 1.0, 1.0], "--ratios"),
        (["--method", "svd"], "--rank"),
        (["--rank", 4], "--rank"),
        (["--method", "svd", "--rank", 0], "--rank"),
    ],
)
def test_bad_options(tool, pair, tmp_path, error_line, argv, option):
    out = tmp_path / "out.safetensors"
    code, _, err = tool("merge-loras", "--inputs", *pair, *argv, "--output", out)
    assert code == 2
    assert option in error_line(err)
    assert not out.exists()


def test_missing_corrupt_and_existing_files(tool, pair, tmp_path, error_line):
    a, b = pair
    out = tmp_path / "out.safetensors"
    missing = tmp_path / "missing.safetensors"
    code, _, err = tool("merge-loras", "--inputs", a, missing, "--output", out)
    assert code == 2 and str(missing) in error_line(err)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b.read_bytes()[:50])
    code, _, err = tool("merge-loras", "--inputs", a, corrupt, "--output", out)
    assert code == 2 and str(corrupt) in error_line(err)
    assert not out.exists()
    out.write_bytes(b"keep")
    code, _, err = tool("merge-loras", "--inputs", a, b, "--output", out)
    assert code == 2 and "--overwrite" in error_line(err)
    assert out.read_bytes() == b"keep"
    code, _, err = tool("merge-loras", "--inputs", a, b, "--output", a, "--overwrite")
    assert code == 2 and "input" in error_line(err)


def test_dora_input_is_refused(tool, tmp_path, error_line):
    tensors = module_tensors(TE, BASE_MODULES[TE])
    tensors[f"{TE}.dora_scale"] = torch.ones(1, 16)
    dora = save(tmp_path / "dora.safetensors", tensors, {})
    plain = save(tmp_path / "plain.safetensors", module_tensors(TE, BASE_MODULES[TE]), {})
    code, _, err = tool(
        "merge-loras", "--inputs", plain, dora, "--output", tmp_path / "o.safetensors"
    )
    assert code == 2
    assert "DoRA" in error_line(err) and str(dora) in err
