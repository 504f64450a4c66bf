"""Adapter kinds are a registry: a kind the families have never heard of trains and round-trips
through files with no family edit.

The kind below is made up for the test: one trained gain per output channel of each target
layer (``y = base(x) * (1 + gain)``), stored in files as ``<module>.scale_gain``. Registered for
the length of a block, it is injected on SD 1.x's default targets, and the seam's functions
(parameters, freeze, saved numbers) and the family's file writer and reader handle it through
the registry.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from library.errors import CheckpointError
from library.models.families.registry import unet_key_layout
from library.models.families.sd.family import SD1
from library.networks.adapters import adapter_parameters, freeze_adapters, saved_numbers
from library.networks.kind_base import AdapterKind, AdapterSettings
from library.networks.kinds import adapter_kinds, kind_for, kind_in, registered
from library.networks.kohya_names import kohya_name, kohya_path
from library.networks.lora import LoraSpec
from library.training.adapter_setup import inject, trains_text_encoders
from tests.kits.sd.tiny import build_tiny_components

SUFFIX = "scale_gain"


class ScaleLayer(nn.Module):
    """A layer plus one gain per output channel, zero at first (the identity)."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base_layer = base
        out = base.out_features if isinstance(base, nn.Linear) else base.out_channels
        self.gain = nn.Parameter(torch.zeros(out))

    def forward(self, x):
        y = self.base_layer(x)
        gain = self.gain if isinstance(self.base_layer, nn.Linear) else self.gain[:, None, None]
        return y * (1 + gain)


class ScaleKind(AdapterKind):
    name = "scale"
    network_modules = ("tests.scale",)

    def settings(self, config):
        return AdapterSettings(LoraSpec(1, 1.0), kind=self.name)

    def inject_targets(self, model, targets, settings):
        model.requires_grad_(False)
        for path in sorted(targets):
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            setattr(parent, child, ScaleLayer(getattr(parent, child)))
        return sorted(targets)

    def layers(self, model):
        return {p: m for p, m in model.named_modules() if isinstance(m, ScaleLayer)}

    def layer_parameters(self, layer):
        return [layer.gain]

    def export_layer(self, layer):
        return {SUFFIX: layer.gain.detach().clone()}

    def check_layer(self, layer, tensors, where):
        if set(tensors) != {SUFFIX}:
            raise CheckpointError(f"{where}: holds {sorted(tensors)}, not {SUFFIX}")
        if tensors[SUFFIX].shape != layer.gain.shape:
            raise CheckpointError(
                f"{where}.{SUFFIX} has shape {list(tensors[SUFFIX].shape)}, the layer needs "
                f"{list(layer.gain.shape)}"
            )

    @torch.no_grad()
    def load_layer(self, layer, tensors, where):
        layer.gain.copy_(tensors[SUFFIX])


def _adapted(kind: ScaleKind):
    parts = build_tiny_components("sd1")
    unet, encoder = parts["unet"], parts["text_encoder"]
    settings = kind_for("tests.scale").settings(None)
    inject(SD1, unet, "unet", settings)
    inject(SD1, encoder, "text_encoder", settings)
    return {"lora_unet": unet, "lora_te": encoder}


def test_a_registered_kind_trains_and_round_trips_through_a_family_file():
    kind = ScaleKind()
    with registered(kind):
        assert kind_for("tests.scale") is kind
        assert kind_for("networks.lora").name == "lora"  # the default kind is unchanged
        assert trains_text_encoders(kind.settings(None))
        models = _adapted(kind)
        unet, encoder = models["lora_unet"], models["lora_te"]
        assert kind_in([unet]) is kind
        layers = kind.layers(unet)
        plain = build_tiny_components("sd1")["unet"]
        assert layers and set(layers) == set(SD1.adapter_targets(plain, "unet", False))
        params = adapter_parameters(unet)
        assert params == [layer.gain for layer in layers.values()]
        assert all(p.requires_grad for p in params)
        assert not any(
            p.requires_grad for p in unet.parameters() if not any(p is q for q in params)
        )
        assert saved_numbers(unet) == sum(p.numel() for p in params)

        frozen = freeze_adapters(encoder, lambda path: ".layers.0." in f".{path}.")
        assert frozen and all(".layers.0." in f".{p}." for p in frozen)
        assert all(not kind.layers(encoder)[p].gain.requires_grad for p in frozen)

        with torch.no_grad():
            for i, p in enumerate(adapter_parameters(unet) + adapter_parameters(encoder)):
                p.copy_(torch.linspace(-1, 1, p.numel()) * (i + 1) / 100)
        tensors = SD1.lora_tensors(models)
        expected = {
            f"{kohya_name(prefix, kohya_path(model, path, unet_key_layout))}.{SUFFIX}"
            for prefix, model in models.items()
            for path in kind.layers(model)
        }
        assert set(tensors) == expected

        fresh = _adapted(kind)
        SD1.load_lora_tensors(fresh, tensors, "scale.safetensors")
        for prefix, model in models.items():
            for path, layer in kind.layers(model).items():
                assert torch.equal(kind.layers(fresh[prefix])[path].gain, layer.gain)

        key = sorted(tensors)[0]
        bad = {**tensors, key: torch.zeros(tensors[key].numel() + 1)}
        with pytest.raises(CheckpointError, match=f"{key}"):
            SD1.load_lora_tensors(_adapted(kind), bad, "bad.safetensors")
    assert kind not in adapter_kinds()
