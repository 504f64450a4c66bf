"""ComfyUI's scaled fp8 files read through CheckpointFile: each scaled weight as its float8
values times its scale, the scales and markers out of the keys, and what cannot be read
refused in one line naming the file and the key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from tests.kits.scaled_fp8 import description, quantize, scaled

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)

    def draw(*shape):
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)

    return {
        "blocks.0.attn.q.weight": draw(8, 4), "blocks.0.attn.q.bias": draw(8),
        "blocks.0.mlp.fc.weight": draw(6, 8), "blocks.0.norm.weight": draw(6),
        "embed.weight": draw(10, 4),
    }  # fmt: skip


def _file(tmp_path, tensors, metadata=None, name="model_fp8_scaled") -> CheckpointFile:
    path = tmp_path / f"{name}.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return CheckpointFile(path)


def _assert_reads(file: CheckpointFile, want: dict[str, torch.Tensor]) -> None:
    assert sorted(file.keys()) == sorted(want) and file.unreadable is None
    for key, value in want.items():
        got = file.tensor(key)
        assert got.dtype == value.dtype and torch.equal(got, value), key
        assert file.shape(key) == tuple(value.shape)


@pytest.mark.parametrize("layout", ["scaled_fp8", "comfy_quant"])
@pytest.mark.parametrize("fp8", FP8, ids=["e4m3fn", "e5m2"])
def test_a_scaled_weight_reads_as_its_fp8_values_times_its_scale(tmp_path, layout, fp8):
    """Quantized matrices come back as q.float() * scale in float32 (bf16 layers as stored),
    the scale, input scale, description and marker tensors are no keys."""
    stored, want = scaled(_state(), layout, fp8)
    file = _file(tmp_path, stored)
    _assert_reads(file, want)
    assert want["blocks.0.attn.q.weight"].dtype == torch.float32
    assert want["blocks.0.norm.weight"].dtype == torch.bfloat16
    # not the float8 values cast: the scale was applied
    raw = stored["blocks.0.attn.q.weight"].to(torch.float32)
    assert not torch.equal(file.tensor("blocks.0.attn.q.weight"), raw)
    # the same from tensors in memory (a pickled file's path)
    _assert_reads(CheckpointFile(file.path, tensors=stored), want)


def test_the_marker_may_carry_the_models_prefix(tmp_path):
    state = {f"model.diffusion_model.{k}": v for k, v in _state().items()}
    stored, want = scaled(state, "scaled_fp8", marker_prefix="model.diffusion_model.")
    _assert_reads(_file(tmp_path, stored), want)


def test_layers_described_in_the_header_and_row_scales(tmp_path):
    """The mixed layout with its descriptions in the header (_quantization_metadata) instead
    of comfy_quant tensors, and one scale per output row ([out, 1])."""
    state = _state()
    weight = state["blocks.0.mlp.fc.weight"].float()
    rows = weight.abs().amax(dim=1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max
    q = (weight / rows).to(torch.float8_e4m3fn)
    stored = {**state, "blocks.0.mlp.fc.weight": q, "blocks.0.mlp.fc.weight_scale": rows}
    layers = {"blocks.0.mlp.fc": {"format": "float8_e4m3fn"}}
    file = _file(tmp_path, stored, {"_quantization_metadata": json.dumps({"layers": layers})})
    _assert_reads(file, {**state, "blocks.0.mlp.fc.weight": q.to(torch.float32) * rows})


def test_without_descriptions_a_scale_counts_beside_a_float8_weight_only(tmp_path):
    """A weight_scale beside a float8 weight is its scale, described or not; a tensor named
    weight_scale beside a bf16 weight, with no description, is the model's own: kept, read as
    stored."""
    stored, want = scaled(_state(), "comfy_quant")
    bare = {k: v for k, v in stored.items() if not k.endswith(".comfy_quant")}
    _assert_reads(_file(tmp_path, bare, name="bare"), want)
    state = {**_state(), "blocks.0.mlp.fc.weight_scale": torch.ones(6, dtype=torch.bfloat16)}
    _assert_reads(_file(tmp_path, state, name="own"), state)


@pytest.mark.parametrize(
    "fmt, extra",
    [("nvfp4", {"weight_scale_2": torch.ones(())}), ("mxfp8", {}), ("int8_tensorwise", {})],
)
def test_other_quantizations_are_refused_naming_the_format_and_key(tmp_path, fmt, extra):
    stored, _ = scaled(_state(), "comfy_quant")
    stored["blocks.0.mlp.fc.comfy_quant"] = description(fmt)
    stored |= {f"blocks.0.mlp.fc.{k}": v for k, v in extra.items()}
    file = _file(tmp_path, stored)
    problem = file.unreadable
    assert problem is not None and "blocks.0.mlp.fc.comfy_quant" in problem and repr(fmt) in problem
    with pytest.raises(ModelError) as info:
        file.refuse_unreadable("t5xxl")
    message = str(info.value)
    assert message.startswith(f"t5xxl = {file.path}: ") and "\n" not in message
    assert "bf16, fp16, fp8 or scaled fp8 file" in message
    with pytest.raises(ModelError, match=f"^{file.path}: .*{fmt}"):
        file.tensor("blocks.0.attn.q.weight")  # nothing of such a file is read


def test_scales_that_fit_no_weight_are_refused(tmp_path):
    """A scale without its weight, a block-wise scale, a description without a scale, a
    description that is no JSON: each named by its key."""
    stored, _ = scaled(_state(), "comfy_quant")
    lone = {**stored, "blocks.1.comfy_quant": description("float8_e4m3fn"),
            "blocks.1.weight_scale": torch.ones(())}  # fmt: skip
    problem = _file(tmp_path, lone, name="lone").unreadable
    assert problem == "blocks.1.weight_scale is a scale without its blocks.1.weight"
    blocks = {**stored, "blocks.0.mlp.fc.weight_scale": torch.ones(6, 2)}
    problem = _file(tmp_path, blocks, name="blocks").unreadable
    assert problem.startswith("blocks.0.mlp.fc.weight_scale has shape (6, 2), which scales")
    unscaled = {k: v for k, v in stored.items() if k != "blocks.0.mlp.fc.weight_scale"}
    problem = _file(tmp_path, unscaled, name="unscaled").unreadable
    assert "blocks.0.mlp.fc.weight_scale is missing" in problem
    garbled = {**stored, "blocks.0.mlp.fc.comfy_quant": torch.zeros(4, dtype=torch.uint8)}
    problem = _file(tmp_path, garbled, name="garbled").unreadable
    assert problem.startswith("blocks.0.mlp.fc.comfy_quant is not")
    old, _ = scaled(_state(), "scaled_fp8")
    old["blocks.1.scale_weight"] = torch.ones(())
    problem = _file(tmp_path, old, name="old").unreadable
    assert problem == "blocks.1.scale_weight is a scale without its blocks.1.weight"


def test_quantize_is_the_absmax_scale():
    """The kit's quantization: the largest value maps to float8's largest."""
    weight = torch.tensor([[1.0, -3.0], [0.5, 2.0]])
    q, scale = quantize(weight, torch.float8_e4m3fn)
    assert scale == 3.0 / 448.0 and q.float().abs().max() == 448.0
