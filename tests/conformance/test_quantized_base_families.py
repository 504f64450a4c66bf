"""Every registered family's denoiser over a quantized base (base_model_precision): with its
frozen Linears stored in nf4 and a LoRA (or a LoHa with DoRA, which reads the base weight) on
its default targets, it computes what the float denoiser holding those weights dequantized
computes with the same adapters: the same output, and the same gradients of the adapters."""

from __future__ import annotations

import copy

import pytest
import torch

from library.models.quantized_base import QuantizedLinear, quantize_linears
from library.networks.lora import LoraSpec, apply_lora, lora_parameters, randomize_lora
from tests.conformance.test_family_conformance import (
    LYCORIS,
    _randomize_lycoris,
    built,
    denoiser_name,
    family_params,
    kit_of,
)


def _pair(name: str):
    """(kit, family, the nf4 denoiser, the float denoiser holding its dequantized weights)."""
    kit = kit_of(name)
    modules = built(name, kit.variant)
    family = kit.family(kit.variant, modules)
    plain = modules[denoiser_name(modules)].requires_grad_(False)
    quantized = copy.deepcopy(plain)
    quantize_linears(quantized, "nf4", True, torch.float32)
    layers = dict(quantized.named_modules())
    with torch.no_grad():
        for path, layer in plain.named_modules():
            if isinstance(layers[path], QuantizedLinear):  # not a Linear under one block
                layer.weight.copy_(layers[path].dequantized(torch.float32))
    assert any(isinstance(m, QuantizedLinear) for m in quantized.modules())
    return kit, family, quantized, plain


def _output(model, inputs) -> torch.Tensor:
    out = model(**inputs)
    out = out.sample if hasattr(out, "sample") else out[0]
    return torch.stack(out) if isinstance(out, list) else out  # Z-Image: one per sample


def _same_run(kit, quantized, plain, params) -> None:
    inputs = kit.denoiser_inputs(plain, 1)
    ours, theirs = _output(quantized, inputs), _output(plain, inputs)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    ours.float().square().mean().backward()
    theirs.float().square().mean().backward()
    for a, b in zip(*params, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("name", family_params())
def test_lora_over_an_nf4_denoiser_is_lora_over_its_dequantized_weights(name):
    kit, family, quantized, plain = _pair(name)
    for model in (quantized, plain):
        apply_lora(model, family.adapter_targets(model, "unet", False), LoraSpec(4, 2.0))
        randomize_lora(model, torch.Generator().manual_seed(5), std=0.1)
    _same_run(kit, quantized, plain, (lora_parameters(quantized), lora_parameters(plain)))


@pytest.mark.parametrize("name", family_params())
def test_loha_with_dora_over_an_nf4_denoiser_is_loha_over_its_dequantized_weights(name):
    from library.networks.adapters import lycoris_layers
    from library.networks.lycoris.spec import LycorisSpec

    kit, family, quantized, plain = _pair(name)
    if "lycoris.kohya" not in family.network_modules:
        pytest.skip(kit.skip_reason("lycoris", f"{name} trains no LyCORIS adapters"))
    for model in (quantized, plain):
        torch.manual_seed(0)  # the factors' initial draw
        family.apply_lycoris(model, "unet", LycorisSpec(**LYCORIS["loha-dora"]), "full")
        _randomize_lycoris(model, seed=3)

    def params(model):
        return [p for layer in lycoris_layers(model).values() for p in layer.adapter_parameters()]

    _same_run(kit, quantized, plain, (params(quantized), params(plain)))
