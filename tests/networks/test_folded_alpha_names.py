"""AliasedPathNames with folds_alpha and fold_into_peft (library.networks.key_maps /
linear_files): a LoRA written under a name of its own in peft's tensors, alpha / r folded into lora_B, reads back into fresh
adapters as the same weight change; LyCORIS tensors are kept as they are."""

from __future__ import annotations

import torch
from torch import nn

from library.networks.key_maps import AliasedPathNames
from library.networks.linear_files import LinearNames, fold_into_peft
from library.networks.lora import LoraSpec, apply_lora, lora_layers, randomize_lora

UNET = "lora_unet"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))


NAMES = LinearNames(
    family="Tiny",
    table=lambda model: (
        {f"diffusion_model.layer{p}": (p,) for p in ("0", "2")}
        | {f"transformer.{p}": (p,) for p in ("0", "2")}
    ),
    written=lambda path: f"diffusion_model.layer{path}",
    peft_prefix="transformer.",
    examples="diffusion_model.layer0",
)


def _delta(model, path) -> torch.Tensor:
    layer = lora_layers(model)[path]
    adapter = next(iter(layer.lora_A))
    down, up = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
    return layer.scaling[adapter] * up.double() @ down.double()


def test_written_in_peft_names_with_alpha_folded_and_read_back():
    names = AliasedPathNames(prefix="diffusion_model.", names=NAMES, folds_alpha=True)
    model = _model()
    apply_lora(model, {"0": "linear", "2": "linear"}, LoraSpec(2, 3.0))
    randomize_lora(model, torch.Generator().manual_seed(1), std=0.2)
    tensors = names.write({UNET: model})
    assert sorted(tensors) == sorted(
        f"diffusion_model.layer{p}.lora_{ab}.weight" for p in ("0", "2") for ab in "AB"
    )
    layer = lora_layers(model)["2"]
    up = layer.lora_B[next(iter(layer.lora_B))].weight
    torch.testing.assert_close(tensors["diffusion_model.layer2.lora_B.weight"], up * 1.5)
    fresh = _model()
    apply_lora(fresh, {"0": "linear", "2": "linear"}, LoraSpec(2, 1.0))
    names.read({UNET: fresh}, tensors, "f.safetensors")
    for path in ("0", "2"):
        torch.testing.assert_close(_delta(fresh, path), _delta(model, path))


def test_other_modules_keep_their_tensors():
    tensors = {"m.hada_w1_a": torch.ones(2, 2), "m.alpha": torch.tensor(1.0),
               "n.lora_down.weight": torch.ones(1, 3), "n.lora_up.weight": torch.ones(2, 1),
               "n.alpha": torch.tensor(2.0)}  # fmt: skip
    out = fold_into_peft(tensors)
    assert sorted(out) == ["m.alpha", "m.hada_w1_a", "n.lora_A.weight", "n.lora_B.weight"]
    assert torch.equal(out["n.lora_B.weight"], torch.full((2, 1), 2.0))
