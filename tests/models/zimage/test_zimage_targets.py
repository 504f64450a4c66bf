"""Default Z-Image LoRA targets against musubi-tuner's and ai-toolkit's selection rules (as data),
on the tiny model, the full-size one (meta device) and a model already given adapters."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from library.models.families.zimage.shapes import transformer_config
from library.models.families.zimage.targets import default_targets, linear_paths
from tests.kits.zimage.tiny_shapes import tiny_transformer_config


def tiny_transformer():
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(0)
    return ZImageTransformer2DModel(**tiny_transformer_config())


def musubi_targets(model: nn.Module) -> set[str]:
    """musubi-tuner networks/lora_zimage.py: Linears inside ZImageTransformerBlock modules
    (networks/lora.py create_modules, path = block path + child path), minus those whose path
    fully matches its default exclude pattern r".*(_modulation|_refiner).*"."""
    exclude = re.compile(r".*(_modulation|_refiner).*")
    found = set()
    for name, block in model.named_modules():
        if type(block).__name__ != "ZImageTransformerBlock":
            continue
        for child, layer in block.named_modules():
            if isinstance(layer, nn.Linear) and not exclude.fullmatch(f"{name}.{child}"):
                found.add(f"{name}.{child}")
    return found


def ai_toolkit_targets(model: nn.Module) -> set[str]:
    """ai-toolkit (extensions_built_in/diffusion_models/z_image, toolkit/lora_special.py): every
    Linear of the transformer whose name contains a transformer block name (["layers"]), as
    transformer_only (the default) keeps."""
    return {
        name
        for name, layer in model.named_modules()
        if isinstance(layer, nn.Linear) and "layers" in f"transformer.{name}"
    }


def test_default_is_musubi_tuners_set_and_modulation_adds_ai_toolkits():
    model = tiny_transformer()
    targets = default_targets(model)
    assert set(targets) == musubi_targets(model)
    assert set(targets.values()) == {"linear"}
    assert sorted(targets) == list(targets)
    assert len(targets) == 2 * 7  # two joint blocks: q, k, v, out, w1, w2, w3
    assert "layers.1.attention.to_out.0" in targets
    assert set(default_targets(model, modulation=True)) == ai_toolkit_targets(model)


def test_refiners():
    model = tiny_transformer()
    with_refiners = default_targets(model, refiners=True)
    assert len(with_refiners) == 6 * 7
    assert "context_refiner.1.feed_forward.w2" in with_refiners
    everything = default_targets(model, refiners=True, modulation=True)
    # the context refiner has no modulation; the top-level embedders and final layer stay out
    assert len(everything) == 6 * 7 + 4
    outside = set(linear_paths(model)) - set(everything)
    assert outside == {
        "all_x_embedder.2-1",
        "all_final_layer.2-1.linear",
        "all_final_layer.2-1.adaLN_modulation.1",
        "t_embedder.mlp.0",
        "t_embedder.mlp.2",
        "cap_embedder.1",
    }


def test_full_size_counts():
    from diffusers import ZImageTransformer2DModel

    with torch.device("meta"):
        model = ZImageTransformer2DModel(**transformer_config())
    assert len(default_targets(model)) == 30 * 7 == len(musubi_targets(model))
    assert len(default_targets(model, modulation=True)) == 30 * 8
    assert len(default_targets(model, refiners=True)) == 34 * 7


def test_same_paths_once_adapted():
    from library.networks.lora import LoraSpec, apply_lora

    model = tiny_transformer()
    targets = default_targets(model)
    assert apply_lora(model, targets, LoraSpec(dim=2, alpha=1.0)) == sorted(targets)
    assert default_targets(model) == targets
    assert not [p for p in linear_paths(model) if "lora_" in p]


def test_no_blocks_is_an_error():
    with pytest.raises(ValueError, match="no ZImageTransformerBlock"):
        default_targets(nn.Sequential(nn.Linear(2, 2)))
