"""Max-norm regularisation scales each adapter's update onto the limit, no more."""

import torch

from library.networks.lora import LoraSpec, apply_lora, lora_layers, randomize_lora
from library.networks.max_norm import apply_max_norm
from tests.networks.lora_merge import lora_delta


def _deltas(model):
    out = {}
    for path, layer in lora_layers(model).items():
        down, up = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        shape = layer.base_layer.weight.shape
        out[path] = lora_delta(down, up, layer.scaling["default"], shape)
    return out


def test_updates_above_the_limit_shrink_onto_it_and_the_rest_stay(unet):
    apply_lora(unet, "unet", LoraSpec(4, 2.0, conv_dim=4, conv_alpha=1.0))
    randomize_lora(unet, torch.Generator().manual_seed(1), std=0.3)
    before = _deltas(unet)
    norms = {k: d.norm().item() for k, d in before.items()}
    limit = sorted(norms.values())[len(norms) // 2]  # about half the adapters are above it
    stats = apply_max_norm([unet], limit)
    after = _deltas(unet)
    above = [k for k, n in norms.items() if n > limit]
    assert stats.scaled == len(above) > 0
    assert abs(stats.max_norm - max(norms.values())) < 1e-4
    for key, delta in before.items():
        # the update's direction is kept; its norm is min(norm, limit), from the formula
        expected = delta * min(1.0, limit / norms[key])
        torch.testing.assert_close(after[key], expected, atol=1e-6, rtol=1e-4)
    assert any(isinstance(lora_layers(unet)[k].base_layer, torch.nn.Conv2d) for k in above)


def test_up_and_down_shrink_by_the_same_factor(unet):
    apply_lora(unet, "unet", LoraSpec(4, 4.0))
    randomize_lora(unet, torch.Generator().manual_seed(2), std=0.5)
    layer = next(iter(lora_layers(unet).values()))
    down0, up0 = layer.lora_A["default"].weight.clone(), layer.lora_B["default"].weight.clone()
    apply_max_norm([unet], 1e-3)
    ratio_down = layer.lora_A["default"].weight.norm() / down0.norm()
    ratio_up = layer.lora_B["default"].weight.norm() / up0.norm()
    torch.testing.assert_close(ratio_down, ratio_up)
