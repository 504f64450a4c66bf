"""fp8_base: frozen Linear weights stored in float8, computed in the training precision; the
loss equals the plain loss of a model whose weights were rounded to float8 by hand."""

from __future__ import annotations

import copy

import pytest
import torch
from cpu_inputs import cpu_inputs
from flux_fixtures import tiny_flux_components
from pydantic import ValidationError

from library.config.schema import Config
from library.models.float8 import FLOAT8, Float8Linear, store_in_float8
from library.training.setup import setup_training
from library.training.step import micro_batch_loss


def _config(**training):
    return Config(
        model={"pretrained_model_name_or_path": "unused"},
        network={"network_train_unet_only": True, "network_dim": 4, "network_alpha": 4.0},
        optimizer={"learning_rate": 1e-4},
        training=training,
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )


def _rounded(module: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy whose Linear weights went through float8 and back (plain PyTorch)."""
    plain = copy.deepcopy(module)
    for path, layer in plain.named_modules():
        if type(layer) is torch.nn.Linear and not path.endswith("DenseReluDense.wo"):
            layer.weight.data = layer.weight.data.to(torch.float8_e4m3fn).to(torch.float32)
    return plain


def test_a_float8_linear_computes_with_the_rounded_weight():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 5).requires_grad_(False)
    x = torch.randn(3, 8)
    expected = torch.nn.functional.linear(x, layer.weight.to(FLOAT8).float(), layer.bias)
    assert store_in_float8(layer, torch.float32) == 1
    assert isinstance(layer, Float8Linear) and layer.weight.dtype == FLOAT8
    assert layer.weight.element_size() == 1
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
    trained = torch.nn.Linear(4, 4)  # a weight that trains is never rounded
    assert store_in_float8(trained, torch.float32) == 0 and trained.weight.dtype == torch.float32


def test_the_backward_pass_keeps_the_float8_weight_not_a_cast_copy():
    """What autograd saves for backward: the float8 weight itself (which exists anyway), no
    compute-dtype copy of it; the input's gradient is the rounded weight's."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32).requires_grad_(False)
    rounded = layer.weight.to(FLOAT8).float()
    store_in_float8(layer, torch.float32)
    saved = []
    x = torch.randn(4, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = layer(x)
    grad = torch.randn(out.shape)
    out.backward(grad)
    big = [t for t in saved if t.numel() == 64 * 32]
    assert big and all(t.dtype == FLOAT8 for t in big)
    torch.testing.assert_close(x.grad, grad @ rounded, rtol=0, atol=0)


def test_fp8_base_loss_equals_the_rounded_models_and_adapters_still_learn():
    batch = {
        "pixel_values": torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1,
        "captions": ["a red circle", "shape"],
        "loss_weights": torch.ones(2),
        "positions": torch.tensor([0, 5]),
        "epoch": 0,
    }
    reference = tiny_flux_components(model_prediction_type="raw")
    reference.denoiser = _rounded(reference.denoiser)
    reference.text_encoders = tuple(_rounded(e) for e in reference.text_encoders)
    torch.manual_seed(0)  # peft draws the down weights from the global generator
    ref_parts = setup_training(_config(), reference)

    c = tiny_flux_components(model_prediction_type="raw")
    torch.manual_seed(0)
    parts = setup_training(_config(fp8_base=True), c)
    fp8_layers = [m for m in c.denoiser.modules() if isinstance(m, Float8Linear)]
    assert fp8_layers and all(m.weight.dtype == FLOAT8 for m in fp8_layers)
    assert all(p.dtype == torch.float32 for p in parts.parameters())
    assert any(isinstance(m, Float8Linear) for m in c.text_encoders[1].modules())  # T5 too
    # the adapters start equal (peft draws them in the compute dtype either way)
    for ours, ref in zip(parts.parameters(), ref_parts.parameters(), strict=True):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    with torch.no_grad():
        for p in [*parts.parameters(), *ref_parts.parameters()]:
            p.add_(0.05)  # non-zero up weights, so the adapters reach the loss
    loss = micro_batch_loss(cpu_inputs(c, 3), batch)
    expected = micro_batch_loss(cpu_inputs(reference, 3), batch)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in parts.parameters()[:4])


def test_fp8_base_unet_keeps_the_text_encoders():
    c = tiny_flux_components()
    setup_training(_config(fp8_base_unet=True), c)
    assert any(isinstance(m, Float8Linear) for m in c.denoiser.modules())
    assert not any(isinstance(m, Float8Linear) for e in c.text_encoders for m in e.modules())


def test_fp8_base_with_full_fine_tuning_is_refused():
    # by the config itself, before any weight is read (tests/config/test_config_cross_rules.py)
    with pytest.raises(ValidationError, match="fp8_base stores frozen weights in float8"):
        Config(
            model={"pretrained_model_name_or_path": "no-such-model"},
            network={"train_mode": "unet"},
            optimizer={"learning_rate": 1e-4},
            training={"fp8_base": True},
            datasets=[{"subsets": [{"image_dir": "unused"}]}],
        )
