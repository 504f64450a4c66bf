"""The dry run's memory estimate: the models built at their shapes on the meta device
(loader.shapes_only, no weight read) give exactly the estimate the loaded models give at the
start of training, for every way a model comes (diffusers folders, single files, FLUX.1 and SD3
component files) and the options that change what is on the device."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from library.models.model_files import shapes_only
from library.training.memory_estimate import estimate_peak_memory
from tests.training.memory_helpers import size_stats, training_parts, write_config

TOKENIZER = Path(__file__).parents[1] / "assets" / "tokenizer"


def _component_keys(files: dict, model: str, parts: tuple[str, ...], module: str) -> dict:
    """Config keys of a FLUX.1 or SD3 model given as component files (and its tokenizers)."""
    keys = {
        "pretrained_model_name_or_path": str(files[model]),
        "tokenizer_path": str(files["tokenizer"]),
        "t5_tokenizer_path": str(files["t5_tokenizer"]),
        "network_module": module,
    }
    return keys | {part: str(files[part]) for part in parts}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model_dir, tiny_sdxl_model_dir):
    from library.models.families.sd.family import SD1
    from library.saving.checkpoint_export import write_single_file
    from tests.kits.flux.tiny_files import write_tiny_flux_files
    from tests.kits.sd.tiny import build_tiny_components
    from tests.kits.sd3.tiny_files import write_tiny_sd3_files

    root = tmp_path_factory.mktemp("dry-run-models")
    sd1 = build_tiny_components("sd1", seed=0)
    single = write_single_file(
        root / "sd1.safetensors", sd1["unet"], sd1["vae"], [sd1["text_encoder"]], SD1,
        torch.float32,
    )  # fmt: skip
    flux = write_tiny_flux_files(root / "flux", "dev", seed=0)
    sd3 = write_tiny_sd3_files(root / "sd3", "sd3.5-medium", 0, text_encoders_inside=False)
    flux_keys = _component_keys(
        flux, "transformer", ("clip_l", "t5xxl", "ae"), "networks.lora_flux"
    )
    return {
        "sd1-folder": {"pretrained_model_name_or_path": str(tiny_model_dir)},
        "sd1-folder-int8": {"pretrained_model_name_or_path": str(tiny_model_dir)},
        "sd1-file": {
            "pretrained_model_name_or_path": str(single),
            "tokenizer_path": str(TOKENIZER),
        },
        "sdxl-folder": {"pretrained_model_name_or_path": str(tiny_sdxl_model_dir)},
        "flux-files": flux_keys,
        "flux-files-nf4": flux_keys,
        "sd3-files": _component_keys(
            sd3, "model", ("clip_l", "clip_g", "t5xxl"), "networks.lora_sd3"
        ),
    }


CASES = {
    "sd1-folder": {"mixed_precision": "bf16", "gradient_checkpointing": True},
    "sd1-file": {"network_module": "lycoris.kohya", "network_args": ["algo=loha", "conv_dim=2"]},
    "sdxl-folder": {"train_mode": "unet", "learning_rate": 1e-5, "ema_decay": 0.99},
    "flux-files": {"fp8_base": True, "blocks_to_swap": 1, "mixed_precision": "bf16"},
    "flux-files-nf4": {
        "base_model_precision": "nf4-bnb",
        "bnb_4bit_use_double_quant": True,
        "fp8_base": True,
        "blocks_to_swap": 1,
        "mixed_precision": "bf16",
    },
    "sd1-folder-int8": {"base_model_precision": "int8-bnb", "mixed_precision": "bf16"},
    "sd3-files": {"mixed_precision": "bf16", "cache_latents": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_shapes_only_models_give_the_loaded_models_estimate(models, tmp_path, case):
    config = write_config(tmp_path, {**models[case], **CASES[case]})
    loaded = training_parts(config)
    with shapes_only():
        shapes = training_parts(config)
    # nothing was read: every weight of every model is shapes only
    modules = (shapes.components.denoiser, shapes.components.vae, *shapes.components.text_encoders)
    tensors = list(itertools.chain.from_iterable(m.parameters() for m in modules))
    assert tensors and all(t.is_meta for t in tensors)
    for draws in (False, True):
        expected = estimate_peak_memory(config, loaded, size_stats(), 1, draws, "cuda")
        assert estimate_peak_memory(config, shapes, size_stats(), 1, draws, "cuda") == expected
        assert expected.weights > 0 and expected.activations > 0


def test_quantized_weights_count_at_their_stored_size(models, tmp_path):
    """base_model_precision: each quantized Linear counts its stored form instead of its bf16
    weight, plus one layer's dequantized weight at a time (the largest)."""
    from library.models.quantized_base import QuantizedLinear

    keys = {**models["sd1-folder"], "mixed_precision": "bf16"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = training_parts(write_config(tmp_path / "a", keys))
    config = write_config(tmp_path / "b", {**keys, "base_model_precision": "nf4-bnb"})
    quantized = training_parts(config)
    layers = [m for m in quantized.components.denoiser.modules() if isinstance(m, QuantizedLinear)]
    assert layers
    sizes = [m.in_features * m.out_features for m in layers]
    saved = sum(2 * n for n in sizes) - sum(m.stored_bytes() for m in layers) - 2 * max(sizes)
    estimate = {
        name: estimate_peak_memory(c, parts, size_stats(), 1, False, "cuda").weights
        for name, c, parts in (("plain", write_config(tmp_path / "a", keys), plain),
                               ("nf4", config, quantized))
    }  # fmt: skip
    assert estimate["plain"] - estimate["nf4"] == saved > 0
