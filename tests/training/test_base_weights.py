"""Which of the model's own weights are not finite, asked when a loss is NaN: frozen weights
(block-swapped ones in host memory too) always; trained ones only before the first step, when
they are still the base model's (afterwards a NaN there is the training's, see check_finite)."""

from __future__ import annotations

import torch

from library.config.schema import Config
from library.models.loader import load_components
from library.training.base_weights import non_finite_model_weights
from library.training.setup import setup_training


def _parts(model_dir, **keys):
    config = Config(
        model={"pretrained_model_name_or_path": str(model_dir)},
        network=keys.pop("network", {}),
        optimizer={"learning_rate": 1e-4},
        training=keys.pop("training", {}),
        flow=keys.pop("flow", {}),
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    return setup_training(config, load_components(config.model, torch.float32, config.flow))


def test_frozen_and_trained_weights(tiny_model_dir):
    parts = _parts(tiny_model_dir)
    assert non_finite_model_weights(parts, 0, False) == []
    with torch.no_grad():
        parts.components.vae.encoder.conv_in.weight[0, 0, 0, 0] = float("inf")
        trained_name, trained = next(iter(parts.trained_weights().items()))
        trained.view(-1)[0] = float("nan")
    unet_key = trained_name.split(".", 1)[1]
    assert non_finite_model_weights(parts, 0, False) == [
        f"unet.{unet_key}",
        "vae.encoder.conv_in.weight",
    ]
    assert non_finite_model_weights(parts, 3, False) == ["vae.encoder.conv_in.weight"]


def test_weights_kept_in_host_memory_by_block_swap(tmp_path):
    from tests.kits.flux.tiny_files import write_tiny_flux_folder

    folder = write_tiny_flux_folder(tmp_path / "flux", "dev", 0)
    parts = _parts(
        folder,
        network={"network_module": "networks.lora_flux", "network_train_unet_only": True},
        training={"blocks_to_swap": 1},
        flow={"split_qkv": True},
    )
    swapped = [
        (path, layer)
        for path, layer in parts.components.denoiser.named_modules()
        if hasattr(layer, "host_weight")
    ]
    assert swapped and non_finite_model_weights(parts, 5, False) == []
    path, layer = swapped[0]
    assert all(layer.host_weight is not p for p in parts.components.denoiser.parameters())
    layer.host_weight[0, 0] = float("nan")
    assert non_finite_model_weights(parts, 5, False) == [f"transformer.{path}.weight"]
