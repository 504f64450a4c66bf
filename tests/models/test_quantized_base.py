"""QuantizedLinear (base_model_precision): the nf4 layer computes what bitsandbytes' own
Linear4bit computes (forward and the input's gradient), with and without double quantization;
the int8 layer computes with bitsandbytes' own dequantization of its per-row int8 weight; the
backward pass keeps no dequantized weight alive; the stored form has the documented size, the
shapes-only (meta) form the real one's shapes, and only device moves reach it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from library.models.quantized_base import QuantizedLinear, quantize_linears


def _linear(seed: int = 0, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(128, 64, bias=bias).requires_grad_(False)


@pytest.mark.parametrize("double_quant", [False, True], ids=["nf4", "nf4-dq"])
def test_nf4_is_bitsandbytes_linear4bit(double_quant):
    import bitsandbytes as bnb

    layer = _linear()
    reference = bnb.nn.Linear4bit(128, 64, compute_dtype=torch.float32, quant_type="nf4",
                                  compress_statistics=double_quant)  # fmt: skip
    reference.load_state_dict(layer.state_dict())
    reference = reference.to("cpu")  # bitsandbytes quantizes on the move
    ours = QuantizedLinear(layer, "nf4", double_quant, torch.float32)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = ours(xa), reference(xb)
    assert torch.equal(ya, yb)
    grad = torch.randn(ya.shape, generator=torch.Generator().manual_seed(2))
    ya.backward(grad)
    yb.backward(grad)
    assert torch.equal(xa.grad, xb.grad)
    assert not torch.equal(ya, layer(x))  # it is quantized


def test_int8_is_bitsandbytes_rowwise_dequantization():
    from bitsandbytes.functional import int8_vectorwise_dequant, int8_vectorwise_quant

    layer = _linear(3)
    ours = QuantizedLinear(layer, "int8", False, torch.float32)
    data, scales, _ = int8_vectorwise_quant(layer.weight.float())
    expected = int8_vectorwise_dequant(data, scales)
    torch.testing.assert_close(ours.dequantized(torch.float32), expected, rtol=1e-6, atol=0)
    x = torch.randn(3, 128)
    torch.testing.assert_close(ours(x), nn.functional.linear(x, expected, layer.bias))
    # per-row int8 error is at most half a step of the row's absmax / 127
    step = layer.weight.abs().amax(dim=1, keepdim=True) / 127
    assert bool(((ours.dequantized(torch.float32) - layer.weight).abs() <= step / 2 + 1e-7).all())


@pytest.mark.parametrize("precision", ["nf4", "int8"])
def test_the_backward_pass_keeps_no_dequantized_weight(precision):
    """What autograd saves for backward: nothing of the weight's size (it is dequantized again
    for the input's gradient), unlike a plain Linear, which saves its weight."""
    ours = QuantizedLinear(_linear(), precision, False, torch.float32)
    plain = _linear()
    weight_size = 128 * 64

    def saved_sizes(module) -> list[int]:
        sizes = []
        x = torch.randn(2, 128, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t,
                                                      lambda t: t):  # fmt: skip
            module(x).sum().backward()
        return sizes

    assert weight_size in saved_sizes(plain.requires_grad_(True))
    assert all(size < weight_size for size in saved_sizes(ours))


def _expected_bytes(precision: str, double_quant: bool, rows: int, cols: int) -> int:
    """The stored form's size from the formats: nf4 packs two weights per byte with a float32
    absmax per block of 64 and a 16-entry float32 code; double quantization stores the absmaxes
    as bytes with a float32 absmax per 256 of them, a 256-entry code and an offset; int8 is a
    byte per weight and a float32 absmax per row."""
    count = rows * cols
    if precision == "int8":
        return count + 4 * rows
    blocks = -(-count // 64)
    if not double_quant:
        return count // 2 + 4 * blocks + 16 * 4
    return count // 2 + blocks + 4 * -(-blocks // 256) + 256 * 4 + 16 * 4 + 4


@pytest.mark.parametrize(("precision", "double_quant"),
                         [("nf4", False), ("nf4", True), ("int8", False)])  # fmt: skip
def test_stored_size_and_the_meta_form(precision, double_quant):
    layer = _linear()
    ours = QuantizedLinear(layer, precision, double_quant, torch.bfloat16)
    with torch.device("meta"):
        shaped = nn.Linear(128, 64)
    meta = QuantizedLinear(shaped, precision, double_quant, torch.bfloat16)
    assert [(t.shape, t.dtype) for t in meta.stored()] == [
        (t.shape, t.dtype) for t in ours.stored()
    ]
    assert (
        meta.stored_bytes()
        == ours.stored_bytes()
        == _expected_bytes(precision, double_quant, 64, 128)
    )
    assert meta.dequantized(torch.bfloat16).shape == (64, 128)


def test_casts_leave_the_stored_form_and_quantize_linears_skips_trained_layers():
    model = nn.Sequential(_linear(), nn.ReLU(), _linear(1).requires_grad_(True))
    assert quantize_linears(model, "nf4", False, torch.float32) == 1
    assert isinstance(model[0], QuantizedLinear) and type(model[2]) is nn.Linear
    before = model[0].dequantized(torch.float32)
    model.to(torch.bfloat16)
    assert model[0].q_data.dtype == torch.uint8 and model[0].q_absmax.dtype == torch.float32
    assert model[0].bias.dtype == torch.bfloat16
    assert torch.equal(model[0].dequantized(torch.float32), before)
    assert not any(p.dtype == torch.uint8 for p in model.parameters())  # not parameters
    assert model[0].weight.shape == (64, 128) and model[0].weight.dtype == torch.float32


def test_quantize_linears_leaves_layers_smaller_than_one_block():
    """A Linear of fewer weights than one quantization block (Krea 2's 12-to-1 text projector)
    stays as it is: nothing to save."""
    tiny = nn.Linear(12, 1).requires_grad_(False)
    model = nn.Sequential(_linear(), tiny)
    assert quantize_linears(model, "nf4", False, torch.float32) == 1
    assert model[1] is tiny
