"""The dry run's memory estimate for Z-Image: Qwen3's states are shaped without running it on
the meta device (its mask code reads values there), and the shapes-only models give exactly the
estimate the loaded ones give, for a LoRA and a full fine-tune, from a folder and from files."""

from __future__ import annotations

import itertools

import pytest
import torch

from library.models.model_files import shapes_only
from library.training.memory_estimate import estimate_peak_memory
from tests.training.memory_helpers import size_stats, training_parts, write_config


@pytest.fixture(scope="module")
def models(zimage_dir, tmp_path_factory):
    from tests.kits.zimage.tiny_files import write_tiny_zimage_files

    files = write_tiny_zimage_files(tmp_path_factory.mktemp("zimage-files"))
    return {
        "folder": {"pretrained_model_name_or_path": str(zimage_dir)},
        "files": {
            "pretrained_model_name_or_path": str(files["transformer"]),
            "tokenizer_path": str(files["tokenizer"]),
            "vae": str(files["ae"]),
            "text_encoder": str(files["text_encoder"]),
        },
    }


CASES = {
    "lora-folder": ("folder", {"network_module": "networks.lora_zimage",
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
    comps = shapes.components
    tensors = [t for m in (comps.denoiser, comps.vae, *comps.text_encoders) for t in
               itertools.chain(m.parameters())]  # fmt: skip
    assert tensors and all(t.is_meta for t in tensors)
    for draws in (False, True):
        expected = estimate_peak_memory(config, loaded, size_stats(), 1, draws, "cuda")
        assert estimate_peak_memory(config, shapes, size_stats(), 1, draws, "cuda") == expected
        assert expected.weights > 0 and expected.activations > 0


def test_meta_text_states_have_the_encoders_shape(zimage_dir):
    """On the meta device encode_text gives states of the shape the real Qwen3 gives."""
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.zimage.load import load_zimage
    from library.training.activation_memory import meta_copy

    comps = load_zimage(ModelSection(pretrained_model_name_or_path=str(zimage_dir)),
                        FlowSection(), torch.float32, torch.float32)  # fmt: skip
    captions = ["a cat", "a much longer caption about a dog on a red sofa"]
    family, tokenizers = comps.family, comps.tokenizers
    real = family.encode_text(tokenizers, comps.text_encoders, captions, "cpu")
    meta = meta_copy(comps.text_encoders[0], torch.bfloat16)
    shaped = family.encode_text(tokenizers, (meta,), captions, "meta")
    assert shaped.hidden.is_meta and shaped.hidden.dtype == torch.bfloat16
    assert shaped.hidden.shape == real.hidden.shape
    assert torch.equal(shaped.lengths, real.lengths)
