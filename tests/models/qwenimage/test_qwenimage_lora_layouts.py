"""Qwen-Image LoRA files of other tools as network_weights: musubi-tuner's own names
(``lora_unet_<path with _>``) and the file diffusers' QwenImagePipeline.save_lora_weights writes
from a peft adapter (``transformer.<path>`` with lora_A / lora_B, its alpha in the header) load
into the trainer's adapters as what they are: the same adapter weights, and the peft adapter's
own weight change (peft's get_delta_weight, alpha pattern included)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from library.errors import CheckpointError
from library.models.families.qwenimage.family import qwenimage_family
from library.models.families.qwenimage.targets import default_targets
from library.networks.fused_keys import adapter_weights
from library.networks.kohya_names import UNET
from library.networks.lora import LoraSpec, apply_lora, randomize_lora
from library.networks.network_weights import import_network_weights, read_network_file
from tests.kits.qwenimage.tiny_shapes import tiny_transformer_config

PREFIX = "diffusion_model."


def _transformer(seed: int = 0):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(seed)
    return QwenImageTransformer2DModel(**tiny_transformer_config())


def _adapted(rank: int = 4, alpha: float = 2.0, seed: int = 0):
    model = _transformer(seed)
    apply_lora(model, default_targets(model), LoraSpec(dim=rank, alpha=alpha))
    return model


def _import(path, model) -> None:
    family = qwenimage_family()
    tensors, metadata = read_network_file(family, path)
    import_network_weights(family, {UNET: model}, tensors, str(path), metadata)


def test_musubi_tuner_names_load_as_the_same_adapters(tmp_path):
    trained = _adapted()
    randomize_lora(trained, torch.Generator().manual_seed(3))
    ours = qwenimage_family().lora_tensors({UNET: trained})
    musubi = {}
    for key, value in ours.items():
        module, tensor = key.removeprefix(PREFIX).rsplit(".", 2)[0], key.rsplit(".", 2)[1:]
        if key.endswith(".alpha"):
            module, tensor = key.removeprefix(PREFIX).rsplit(".", 1)[0], ["alpha"]
        musubi["lora_unet_" + module.replace(".", "_") + "." + ".".join(tensor)] = value
    assert "lora_unet_transformer_blocks_0_img_mlp_net_0_proj.lora_down.weight" in musubi
    path = tmp_path / "musubi.safetensors"
    save_file(musubi, str(path), metadata={"ss_network_module": "networks.lora_qwen_image"})
    fresh = _adapted()
    _import(path, fresh)
    want, got = adapter_weights(trained), adapter_weights(fresh)
    assert want.keys() == got.keys()
    for module, (down, up, alpha) in want.items():
        assert torch.equal(got[module][0], down) and torch.equal(got[module][1], up), module
        assert got[module][2] == alpha


def _peft_file(tmp_path, metadata: bool):
    """diffusers' own Qwen-Image LoRA file from a peft adapter (r 4, lora_alpha 8, one module
    at alpha 2), and that adapter's model."""
    from diffusers import QwenImagePipeline
    from peft import LoraConfig, get_peft_model_state_dict

    model = _transformer()
    paths = sorted(default_targets(model))
    config = LoraConfig(r=4, lora_alpha=8.0, target_modules=paths,
                        alpha_pattern={"transformer_blocks.1.attn.to_q": 2.0})  # fmt: skip
    model.add_adapter(config)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    extra = {"transformer_lora_adapter_metadata": config.to_dict()} if metadata else {}
    folder = tmp_path / ("with" if metadata else "without")
    QwenImagePipeline.save_lora_weights(
        folder, transformer_lora_layers=get_peft_model_state_dict(model), **extra
    )
    return folder / "pytorch_lora_weights.safetensors", model, paths


@pytest.mark.parametrize("metadata", [True, False], ids=["header", "no-header"])
def test_a_diffusers_peft_file_loads_as_peft_applies_it(tmp_path, metadata):
    """With its header, each Linear's change is peft's own (lora_alpha / r, the pattern's
    alpha for one module); without one, as every reader of a bare peft file assumes, scale 1."""
    path, peft_model, paths = _peft_file(tmp_path, metadata)
    with safe_open(str(path), "pt") as f:
        assert "transformer.transformer_blocks.0.attn.to_k.lora_A.weight" in set(f.keys())
    ours = _adapted(rank=4)
    _import(path, ours)
    weights = adapter_weights(ours)
    assert sorted(weights) == paths
    for module in paths:
        layer = peft_model.get_submodule(module)
        change = layer.get_delta_weight("default")
        if not metadata:  # scale 1: alpha = rank
            change = change / layer.scaling["default"]
        down, up, alpha = weights[module]
        ours_change = alpha / down.shape[0] * (up.float() @ down.float())
        torch.testing.assert_close(ours_change, change, rtol=1e-5, atol=1e-7)


def test_a_file_of_another_model_is_refused_by_name(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"lora_unet_transformer_blocks_0_attn_to_qq.lora_down.weight": torch.zeros(4, 32),
               "lora_unet_transformer_blocks_0_attn_to_qq.lora_up.weight": torch.zeros(32, 4),
               "lora_unet_transformer_blocks_0_img_mlp_net_2.lora_down.weight": torch.zeros(4, 128),
               "lora_unet_transformer_blocks_0_img_mlp_net_2.lora_up.weight": torch.zeros(32, 4)},
              str(path))  # fmt: skip
    with pytest.raises(CheckpointError, match="to_qq.*no Linear of the Qwen-Image transformer"):
        _import(path, _adapted())
