"""lora_tool.py metadata: showing (text and JSON), editing with bit-identical tensors and
recomputed hashes, and the edits it refuses."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from tests.lora_tools.lora_files import BASE_METADATA, BASE_MODULES, module_tensors, save

TE = "lora_te_text_model_encoder_layers_0_mlp_fc1"


@pytest.fixture
def mixed_file(tmp_path):
    """A file with bf16 weights, an fp16 alpha and a float32 one (as other tools write them):
    a writer that casts anything would change its bytes."""
    tensors = {}
    for index, (name, spec) in enumerate(BASE_MODULES.items()):
        tensors.update(module_tensors(name, spec, index))
    for key in list(tensors):
        if key.endswith(".weight"):
            tensors[key] = tensors[key].to(torch.bfloat16)
    tensors[f"{TE}.alpha"] = tensors[f"{TE}.alpha"].to(torch.float16)
    tensors["lora_unet_down_blocks_0_resnets_0_conv1.lora_up.weight"][0, 0, 0, 0] = -0.0
    return save(tmp_path / "mixed.safetensors", tensors, dict(BASE_METADATA))


def _raw(tensors):
    return {
        k: (t.dtype, tuple(t.shape), t.reshape(-1).contiguous().view(torch.uint8).tolist())
        for k, t in tensors.items()
    }


def _data_hash(path):
    """sha256 of everything after the safetensors header: kohya's sshs_model_hash."""
    blob = path.read_bytes()
    header = int.from_bytes(blob[:8], "little")
    return hashlib.sha256(blob[8 + header :]).hexdigest()


def test_show_lists_the_summary_and_every_key(tool, lora_file):
    code, out, err = tool("metadata", "--input", lora_file)
    assert code == 0, err
    lines = out.splitlines()
    summary = lines[0]
    assert summary.startswith(f"{lora_file}: 4 modules, ")
    assert "LoCon x1" in summary and "LoRA x3" in summary
    assert "rank 6/8" in summary and "alpha 1/4/8/16" in summary and "fp32" in summary
    assert "lora_te (1)" in summary and "lora_unet (3)" in summary
    assert lines[1] == f"metadata ({len(BASE_METADATA)} keys):"
    keys = [line.split()[0] for line in lines[2:]]
    assert keys == sorted(BASE_METADATA)
    tags = next(line for line in lines if line.strip().startswith("ss_tag_frequency"))
    assert "--full shows all" in tags and BASE_METADATA["ss_tag_frequency"] not in tags
    code, out, _ = tool("metadata", "--input", lora_file, "--full")
    assert code == 0 and BASE_METADATA["ss_tag_frequency"] in out


def test_json_is_the_whole_header(tool, lora_file):
    code, out, err = tool("metadata", "--input", lora_file, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["metadata"] == BASE_METADATA
    summary = document["summary"]
    assert summary["modules"] == 4
    assert summary["algorithms"] == {"LoCon": 1, "LoRA": 3}
    assert summary["ranks"] == [6, 8]
    assert summary["alphas"] == [1.0, 4.0, 8.0, 16.0]
    assert summary["dtypes"] == ["fp32"]
    assert summary["prefixes"] == {"lora_te": 1, "lora_unet": 3}


@pytest.mark.parametrize(
    ("suffixes", "algorithm"),
    [
        (
            {"hada_w1_a": [4, 2], "hada_w1_b": [2, 6], "hada_w2_a": [4, 2], "hada_w2_b": [2, 6]},
            "LoHa",
        ),
        ({"lokr_w1": [2, 2], "lokr_w2_a": [2, 1], "lokr_w2_b": [1, 3]}, "LoKr"),
        ({"lora_down.weight": [2, 6], "lora_up.weight": [4, 2], "dora_scale": [1, 6]}, "DoRA"),
    ],
)
def test_lycoris_and_dora_are_named(tool, tmp_path, suffixes, algorithm):
    tensors = {f"lora_unet_x.{k}": torch.randn(shape) for k, shape in suffixes.items()}
    path = save(tmp_path / "other.safetensors", tensors, None)
    code, out, err = tool("metadata", "--input", path, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["summary"]["algorithms"] == {algorithm: 1}
    assert document["metadata"] == {}
    code, out, _ = tool("metadata", "--input", path)
    assert f"1 modules, {algorithm}," in out and "metadata: none" in out


def test_edit_keeps_tensors_bit_identical(tool, mixed_file, tmp_path, read_file):
    out = tmp_path / "edited.safetensors"
    code, stdout, err = tool(
        "metadata", "--input", mixed_file, "--set", "ss_output_name=renamed",
        "--set", "modelspec.trigger_phrase=a = b", "--remove", "ss_tag_frequency",
        "--output", out,
    )  # fmt: skip
    assert code == 0, err
    before, old = read_file(mixed_file)
    after, new = read_file(out)
    assert _raw(after) == _raw(before)
    assert new["ss_output_name"] == "renamed"
    assert new["modelspec.trigger_phrase"] == "a = b"
    assert "ss_tag_frequency" not in new
    untouched = set(old) - {
        "ss_output_name",
        "ss_tag_frequency",
        "sshs_model_hash",
        "sshs_legacy_hash",
    }
    assert {k: new[k] for k in untouched} == {k: old[k] for k in untouched}
    assert new["sshs_model_hash"] == _data_hash(out) != "stale"
    assert "set ss_output_name, modelspec.trigger_phrase; removed ss_tag_frequency" in stdout
    assert read_file(mixed_file)[1] == old  # the input is untouched


def test_in_place_replaces_the_input(tool, mixed_file, read_file):
    before, _ = read_file(mixed_file)
    code, _, err = tool(
        "metadata", "--input", mixed_file, "--set", "ss_training_comment=x", "--in_place"
    )
    assert code == 0, err
    after, metadata = read_file(mixed_file)
    assert _raw(after) == _raw(before)
    assert metadata["ss_training_comment"] == "x"
    assert metadata["sshs_model_hash"] == _data_hash(mixed_file)
    assert not list(mixed_file.parent.glob("*.tmp*"))


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--set", "novalue"], "--set"),
        (["--set", "=value"], "--set"),
        (["--set", "sshs_model_hash=x"], "--set"),
        (["--remove", "ss_not_there"], "--remove"),
        (["--set", "a=1", "--remove", "a"], "--remove"),
        (["--set", "a=1"], "--output"),
        (["--in_place"], "--in_place"),
        (["--set", "a=1", "--in_place", "--output", "x.safetensors"], "--in_place"),
    ],
)
def test_bad_edits(tool, lora_file, error_line, argv, option):
    before = lora_file.read_bytes()
    code, _, err = tool("metadata", "--input", lora_file, *argv)
    assert code == 2
    assert option in error_line(err)
    assert lora_file.read_bytes() == before


def test_output_rules(tool, lora_file, tmp_path, error_line):
    out = tmp_path / "taken.safetensors"
    out.write_bytes(b"keep")
    code, _, err = tool("metadata", "--input", lora_file, "--set", "a=1", "--output", out)
    assert code == 2 and "--overwrite" in error_line(err)
    assert out.read_bytes() == b"keep"
    code, _, err = tool(
        "metadata", "--input", lora_file, "--set", "a=1", "--output", lora_file, "--overwrite"
    )
    assert code == 2 and "--in_place" in error_line(err)


def test_missing_and_corrupt_input(tool, lora_file, tmp_path, error_line):
    missing = tmp_path / "missing.safetensors"
    code, _, err = tool("metadata", "--input", missing)
    assert code == 2 and str(missing) in error_line(err)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(lora_file.read_bytes()[:-7])
    code, _, err = tool("metadata", "--input", corrupt)
    assert code == 2 and str(corrupt) in error_line(err)
