"""The dry run's memory estimate for Chroma: T5's states are shaped without running it on the
meta device (its padding-mask code reads values there), and the shapes-only models give exactly
the estimate the loaded ones give, for a LoRA from a folder and a full fine-tune from files."""

from __future__ import annotations

import pytest

from library.models.model_files import shapes_only
from library.training.memory_estimate import estimate_peak_memory
from tests.kits.chroma.tiny import write_tiny_chroma_folder
from tests.kits.chroma.tiny_files import write_tiny_chroma_files
from tests.training.memory_helpers import size_stats, training_parts, write_config


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = write_tiny_chroma_folder(tmp_path_factory.mktemp("chroma") / "tiny-chroma")
    files = write_tiny_chroma_files(tmp_path_factory.mktemp("chroma-files"))
    return {
        "folder": {"pretrained_model_name_or_path": str(folder)},
        "files": {
            "pretrained_model_name_or_path": str(files["transformer"]),
            "t5xxl": str(files["t5xxl"]),
            "ae": str(files["ae"]),
            "t5_tokenizer_path": str(files["t5_tokenizer"]),
        },
    }


CASES = {
    "lora-folder": ("folder", {"network_module": "networks.lora_flux",
                               "network_train_unet_only": True, "mixed_precision": "bf16"}),
    "full-files": ("files", {"train_mode": "unet", "learning_rate": 1e-5,
                             "gradient_checkpointing": True}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_shapes_only_models_give_the_loaded_models_estimate(models, tmp_path, case):
    model, keys = CASES[case]
    config = write_config(tmp_path, {**models[model], **keys})
    loaded = training_parts(config)
    with shapes_only():
        shapes = training_parts(config)
    assert all(p.is_meta for p in shapes.components.text_encoders[0].parameters())
    for draws in (False, True):
        expected = estimate_peak_memory(config, loaded, size_stats(), 1, draws, "cuda")
        assert estimate_peak_memory(config, shapes, size_stats(), 1, draws, "cuda") == expected
        assert expected.weights > 0 and expected.activations > 0
