"""What is particular to Krea 2 beyond the conformance suite: the dry run's memory estimate on
shapes alone, the Turbo warning, the taps of single files, the LoRA layout diffusers reads."""

from __future__ import annotations

import itertools
import logging

import torch

from library.models.families.krea2 import spec
from library.models.model_files import shapes_only
from library.training.memory_estimate import estimate_peak_memory
from tests.training.memory_helpers import size_stats, training_parts, write_config


def test_shapes_only_models_give_the_loaded_models_estimate(krea2_dir, tmp_path):
    keys = {"pretrained_model_name_or_path": str(krea2_dir),
            "network_module": "networks.lora_krea2", "mixed_precision": "bf16"}  # fmt: skip
    config = write_config(tmp_path, keys)
    loaded = training_parts(config)
    with shapes_only():
        shapes = training_parts(config)
    comps = shapes.components
    modules = (comps.denoiser, comps.vae, *comps.text_encoders)
    assert all(t.is_meta for t in itertools.chain(*(m.parameters() for m in modules)))
    for draws in (False, True):
        expected = estimate_peak_memory(config, loaded, size_stats(), 1, draws, "cuda")
        assert estimate_peak_memory(config, shapes, size_stats(), 1, draws, "cuda") == expected
        assert expected.weights > 0 and expected.activations > 0


def test_a_turbo_folder_warns_that_raw_is_the_one_to_train(krea2_dir, tmp_path, caplog):
    import json
    import shutil

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.krea2.load import load_krea2

    turbo = tmp_path / "turbo"
    shutil.copytree(krea2_dir, turbo)
    index = json.loads((turbo / "model_index.json").read_text())
    (turbo / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    model = ModelSection(pretrained_model_name_or_path=str(turbo))
    with caplog.at_level(logging.WARNING):
        comps = load_krea2(model, FlowSection(), torch.float32, torch.float32)
    assert comps.family.distilled and "Krea 2 RAW" in caplog.text
    assert comps.family.sampling_pipeline().prompt_defaults["scale"] == 1.0  # no guidance


def test_single_file_taps_are_the_releases():
    assert spec.taps_for(36, 12) == (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)


def test_every_linear_has_one_original_name_diffusers_maps_back():
    """The names the LoRA files are written in are the ones diffusers' Krea 2 LoRA converter
    maps to each Linear (its own table, not ours)."""
    from diffusers import Krea2Transformer2DModel
    from diffusers.loaders.lora_conversion_utils import (
        _convert_non_diffusers_krea2_lora_to_diffusers as convert,
    )

    from library.models.families.krea2.keys import TABLE
    from library.networks.fused_keys import linears_inside
    from library.networks.path_names import original_module
    from tests.kits.krea2.tiny import transformer_config

    model = Krea2Transformer2DModel(**transformer_config())
    paths = linears_inside(model)
    keys = {f"diffusion_model.{original_module(TABLE, p)}.lora_A.weight": torch.zeros(1)
            for p in paths}  # fmt: skip
    assert sorted(convert(keys)) == sorted(f"transformer.{p}.lora_A.weight" for p in paths)


def test_turbo_dit_samples_on_turbo_and_puts_raw_back(krea2_dir, tmp_path):
    """With [flow] turbo_dit, a round's image is the one diffusers' pipeline draws from the
    Turbo folder itself (its fixed shift, no guidance), the trained adapters on top (a LoRA
    over Turbo's weights); after the round the transformer holds RAW's weights again."""
    import json
    import shutil

    import numpy as np
    from diffusers import Krea2Pipeline
    from PIL import Image

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components
    from library.networks.lora import LoraSpec, apply_lora, randomize_lora
    from library.sampling.generate import sample_images
    from library.sampling.prompts import SamplePrompt
    from tests.kits.krea2.tiny import build_tiny_krea2_components

    turbo = tmp_path / "turbo"  # RAW's text encoder and VAE, another transformer, distilled
    shutil.copytree(krea2_dir, turbo)
    shutil.rmtree(turbo / "transformer")
    build_tiny_krea2_components(1)["transformer"].save_pretrained(turbo / "transformer")
    index = json.loads((turbo / "model_index.json").read_text())
    (turbo / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    model = ModelSection(pretrained_model_name_or_path=str(krea2_dir))
    comps = load_components(model, torch.float32, FlowSection(turbo_dit=str(turbo)))
    targets = comps.family.adapter_targets(comps.denoiser, "unet", False)
    apply_lora(comps.denoiser, targets, LoraSpec(4, 4.0))
    randomize_lora(comps.denoiser, torch.Generator().manual_seed(3), std=0.05)
    before = {k: v.clone() for k, v in comps.denoiser.state_dict().items()}
    p = SamplePrompt(index=0, prompt="a red cube", negative_prompt="", width=64, height=64,
                     seed=5, steps=3, scale=None, sampler=None)  # fmt: skip
    done = sample_images(comps, [p], step=0, output_dir=tmp_path / "out", output_name="s")
    with Image.open(done.images[0]) as image:
        ours = np.asarray(image.convert("RGB"), dtype=np.int16)
    after = comps.denoiser.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # RAW and the LoRA again

    pipe = Krea2Pipeline.from_pretrained(str(turbo), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    apply_lora(pipe.transformer, targets, LoraSpec(4, 4.0))
    pipe.transformer.load_state_dict(
        {k: v for k, v in before.items() if ".lora_" in k}, strict=False
    )
    image = pipe("a red cube", width=64, height=64, num_inference_steps=3, guidance_scale=0.0,
                 generator=torch.Generator().manual_seed(5)).images[0]  # fmt: skip
    theirs = np.asarray(image.convert("RGB"), dtype=np.int16)
    assert int(abs(ours - theirs).max()) <= 1
    raw = Krea2Pipeline.from_pretrained(str(krea2_dir), local_files_only=True)
    assert not torch.equal(raw.transformer.img_in.weight, pipe.transformer.img_in.base_layer.weight)


def test_turbo_dit_is_refused_where_the_swap_cannot_run(tmp_path):
    import pytest

    from library.errors import ConfigError
    from library.models.families.krea2.family import krea2_family

    keys = {"pretrained_model_name_or_path": str(tmp_path), "turbo_dit": "/t.safetensors",
            "network_module": "networks.lora_krea2", "fp8_base": True}  # fmt: skip
    config = write_config(tmp_path, keys)
    with pytest.raises(ConfigError, match="turbo_dit .* fp8_base"):
        krea2_family().check_training(config)
