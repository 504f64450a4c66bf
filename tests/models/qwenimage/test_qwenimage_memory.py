"""The dry run's memory estimate for Qwen-Image: Qwen2.5-VL's states are shaped without running
it on the meta device, and the shapes-only models give exactly the estimate the loaded ones
give."""

from __future__ import annotations

import itertools

import torch

from library.models.model_files import shapes_only
from library.training.activation_memory import meta_copy
from library.training.memory_estimate import estimate_peak_memory
from tests.training.memory_helpers import size_stats, training_parts, write_config


def test_shapes_only_models_give_the_loaded_models_estimate(qwenimage_dir, tmp_path):
    keys = {"pretrained_model_name_or_path": str(qwenimage_dir),
            "network_module": "networks.lora_qwen_image", "network_train_unet_only": True,
            "mixed_precision": "bf16"}  # fmt: skip
    config = write_config(tmp_path, keys)
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


def test_meta_text_states_have_the_encoders_shape(qwenimage_components):
    comps = qwenimage_components
    captions = ["a cat", "a much longer caption about a dog on a red sofa"]
    family, tokenizers = comps.family, comps.tokenizers
    real = family.encode_text(tokenizers, comps.text_encoders, captions, "cpu")
    meta = meta_copy(comps.text_encoders[0], torch.bfloat16)
    shaped = family.encode_text(tokenizers, (meta,), captions, "meta")
    assert shaped.hidden.is_meta and shaped.hidden.dtype == torch.bfloat16
    assert shaped.hidden.shape == real.hidden.shape
    assert torch.equal(shaped.lengths, real.lengths)
