"""Sampling Z-Image during training: diffusers' ZImagePipeline fed our own conditioning.

The facts (diffusers' ZImagePipeline, the released model cards and ComfyUI's templates):

- sampler: Euler on the rectified flow over the variant's static-shift schedule (the loaded
  scheduler config: shift 3.0 Turbo, 6.0 Base); the pipeline does the steps and the VAE;
- conditioning: one [L_i, 2560] tensor of Qwen3 states per caption, at the caption's own length
  (the family's encode_text gives them padded with their lengths; they are cut back here);
- guidance: the pipeline combines pos + g * (pos - neg), so its g is the usual CFG scale minus
  1, and g = 0 runs no negative pass. A prompt's ``scale`` (kohya's ``--l``) is the usual scale:
  unset, 1 (no guidance) for Turbo, which is distilled to sample without it, and 4 for Base
  (ComfyUI's and the hosted services' Base default). Turbo samples well in 8-9 steps, Base in
  about 25-50: the prompt's ``steps`` (``--s``, sample_steps) say how many;
- size: image sides are rounded down to a multiple of 16 (the AE's 8 times the 2x2 patches).
"""

from __future__ import annotations

from library.models import caption_lengths
from library.models.conditioning import Conditioning
from library.sampling.pipelines import PipelineKind, on_grid

SIZE_GRID = 16
# The usual CFG scale of a prompt that gives none, per variant.
SAMPLE_CFG_SCALE = {"turbo": 1.0, "base": 4.0, "custom": 4.0}


def zimage_pipeline_kind(variant: str):
    """ZImagePipeline, taking Z-Image's conditioning through ``zimage_pipeline_inputs``; a
    prompt's unset sampler and scale become Euler and the variant's scale."""
    return PipelineKind(
        "ZImagePipeline",
        denoiser_argument="transformer",
        call_inputs=zimage_pipeline_inputs,
        prompt_defaults={"sampler": "euler", "scale": SAMPLE_CFG_SCALE[variant]},
    )


def zimage_pipeline_inputs(cond: Conditioning, prompt) -> dict:
    """ZImagePipeline call keywords from the conditioning of [prompt, negative prompt] and the
    prompt's settings: each caption's states at its own length, the pipeline's guidance scale
    (the usual scale - 1; the negative prompt only when it is above 0) and the 16-pixel size."""

    positive, negative = caption_lengths.pipeline_rows(cond, "ZImagePipeline")
    guidance = max(float(prompt.scale) - 1.0, 0.0)
    inputs = {
        "prompt_embeds": [positive],
        "guidance_scale": guidance,
        "width": on_grid(prompt.width, SIZE_GRID),
        "height": on_grid(prompt.height, SIZE_GRID),
    }
    if guidance > 0:
        inputs["negative_prompt_embeds"] = [negative]
    return inputs
