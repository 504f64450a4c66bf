"""Z-Image's sampling defaults. (The image our sampler draws equals the one diffusers'
ZImagePipeline draws itself, for Turbo's default without guidance, a guided prompt with a
negative prompt and Base's default guidance: the conformance suite's
test_sample_equals_the_diffusers_pipeline.)"""

from __future__ import annotations

from library.sampling.prompts import SamplePrompt


def _prompt(**keys) -> SamplePrompt:
    values = {"index": 0, "prompt": "a red cube on a table", "negative_prompt": "", "width": 64,
              "height": 64, "seed": 11, "steps": 3, "scale": None, "sampler": None}  # fmt: skip
    return SamplePrompt(**{**values, **keys})


def test_base_defaults_to_guidance_and_turbo_to_none():
    from library.models.families.zimage.family import zimage_family

    kind = zimage_family("base", 6.0).sampling_pipeline()
    assert kind.class_name == "ZImagePipeline" and kind.denoiser_argument == "transformer"
    assert kind.complete(_prompt()).scale == 4.0
    assert zimage_family("turbo", 3.0).sampling_pipeline().complete(_prompt()).scale == 1.0
