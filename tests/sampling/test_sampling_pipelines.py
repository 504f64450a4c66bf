"""Which diffusers pipeline a family samples with, and how conditioning becomes its inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from library.errors import ConfigError
from library.models.conditioning import Conditioning
from library.models.families.sd.family import SD1, SD1_V, SD2, SD2_V, SDXL, SDXL_V
from library.sampling.pipelines import pipeline_inputs, pipeline_kind
from library.sampling.samplers import build_sampler
from tests.kits.sd.tiny import tiny_scheduler_config


@pytest.mark.parametrize(
    ("family", "name"),
    [(f, "StableDiffusionPipeline") for f in (SD1, SD1_V, SD2, SD2_V)]
    + [(f, "StableDiffusionXLPipeline") for f in (SDXL, SDXL_V)],
)
def test_each_family_gets_its_pipeline(family, name):
    assert pipeline_kind(family).class_name == name


@pytest.mark.parametrize(
    "odd",
    [
        replace(SD1, name="odd", uses_pooled_text_embedding=True),  # pooled but no sizes
        replace(SDXL, name="odd", uses_size_conditioning=False),
        replace(SD1, name="odd", text_encoder_subfolders=("a", "b", "c")),
    ],
)
def test_families_no_pipeline_takes_are_a_config_error(odd):
    with pytest.raises(ConfigError, match="sampling odd models during training is not supported"):
        pipeline_kind(odd)


def test_sd_conditioning_is_prompt_and_negative_embeddings():
    hidden = torch.randn(2, 77, 32)
    inputs = pipeline_inputs(Conditioning(hidden))
    assert inputs.keys() == {"prompt_embeds", "negative_prompt_embeds"}
    assert torch.equal(inputs["prompt_embeds"], hidden[:1])
    assert torch.equal(inputs["negative_prompt_embeds"], hidden[1:])


def test_sdxl_conditioning_carries_pooled_embeddings_and_sizes():
    hidden, pooled = torch.randn(2, 77, 80), torch.randn(2, 24)
    # Rows: (original h, w, crop top, left, target h, w) of the prompt and of the negative.
    time_ids = torch.tensor([[480.0, 640, 16, 8, 64, 96], [64, 96, 0, 0, 64, 96]])
    added = {"text_embeds": pooled, "time_ids": time_ids}
    inputs = pipeline_inputs(Conditioning(hidden, {"added_cond_kwargs": added}))
    assert torch.equal(inputs.pop("pooled_prompt_embeds"), pooled[:1])
    assert torch.equal(inputs.pop("negative_pooled_prompt_embeds"), pooled[1:])
    assert torch.equal(inputs.pop("prompt_embeds"), hidden[:1])
    assert torch.equal(inputs.pop("negative_prompt_embeds"), hidden[1:])
    assert inputs == {
        "original_size": (480, 640),
        "crops_coords_top_left": (16, 8),
        "target_size": (64, 96),
        "negative_original_size": (64, 96),
        "negative_crops_coords_top_left": (0, 0),
        "negative_target_size": (64, 96),
    }


def test_conditioning_no_pipeline_argument_carries_is_refused():
    added = {"text_embeds": torch.zeros(2, 4), "image_embeds": torch.zeros(2, 4)}
    with pytest.raises(ValueError, match="'image_embeds'"):
        pipeline_inputs(Conditioning(torch.zeros(2, 3, 4), {"added_cond_kwargs": added}))


def test_a_family_pipeline_refuses_what_its_call_inputs_do_not_carry():
    """refuse_uncarried, which the transformer families' call inputs run first: the inputs
    they pass on are accepted, any other is named with the pipeline."""
    from library.sampling.pipelines import refuse_uncarried

    cond = Conditioning(torch.zeros(2, 3, 4), {"text_mask": torch.ones(2, 3)})
    refuse_uncarried(cond, ("text_mask", "pooled_projections"), "SomePipeline")
    cond.unet_kwargs["reference_latents"] = []
    with pytest.raises(ValueError, match="no SomePipeline argument carries .*'reference_latents'"):
        refuse_uncarried(cond, ("text_mask",), "SomePipeline")


def test_sdxl_euler_config_samples_ddim_without_clipping():
    """SDXL folders ship an Euler config that may lack DDIM's keys; DDIM must not then fall back
    to clipping x0 to [-1, 1] (latents are not bounded) or to alpha 1 at the end."""
    config = {**tiny_scheduler_config("sd1"), "timestep_spacing": "leading"}
    del config["clip_sample"], config["set_alpha_to_one"]
    ddim = build_sampler("ddim", config, "epsilon")
    assert (ddim.config.clip_sample, ddim.config.set_alpha_to_one) == (False, False)
    assert ddim.final_alpha_cumprod == ddim.alphas_cumprod[0]
    # A config that says otherwise is followed.
    said = build_sampler("ddim", {**config, "clip_sample": True}, "epsilon")
    assert said.config.clip_sample is True
