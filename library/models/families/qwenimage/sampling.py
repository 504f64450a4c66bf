"""Sampling Qwen-Image during training: diffusers' QwenImagePipeline fed our conditioning.

The facts (diffusers' QwenImagePipeline):

- sampler: Euler on the rectified flow over the loaded scheduler's size-dependent shift; the
  pipeline does the steps and the VAE;
- conditioning: the caption states at the caption's own length, with their mask;
- guidance: "true CFG", neg + s * (pos - neg) rescaled to the positive prediction's norm per
  token, run when the scale s is above 1 and a negative prompt is given (the pipeline's
  ``true_cfg_scale``, 4 by default; an empty negative prompt counts). A prompt's ``scale`` is s;
  unset, 4 as the pipeline's;
- size: image sides are rounded down to a multiple of 16 (the VAE's 8 times the 2x2 patches).
"""

from __future__ import annotations

import torch

from library.models import caption_lengths
from library.models.conditioning import Conditioning
from library.models.families.qwenimage.shapes import PIXEL_MULTIPLE
from library.sampling.pipelines import PipelineKind, on_grid

SAMPLE_CFG_SCALE = 4.0  # the pipeline's default true_cfg_scale


def qwenimage_pipeline_kind() -> PipelineKind:
    """QwenImagePipeline, taking Qwen-Image's conditioning through ``qwenimage_pipeline_inputs``."""
    return PipelineKind(
        "QwenImagePipeline",
        denoiser_argument="transformer",
        call_inputs=qwenimage_pipeline_inputs,
        prompt_defaults={"sampler": "euler", "scale": SAMPLE_CFG_SCALE},
    )


def qwenimage_pipeline_inputs(cond: Conditioning, prompt) -> dict:
    """QwenImagePipeline call keywords from the conditioning of [prompt, negative prompt]: each
    caption's states at its own length with an all-ones mask, true_cfg_scale (the negative only
    above 1) and the 16-pixel size."""
    positive, negative = caption_lengths.pipeline_rows(cond, "QwenImagePipeline", keep_batch=True)
    scale = float(prompt.scale)
    inputs = {
        "prompt_embeds": positive,
        "prompt_embeds_mask": _ones(positive),
        "true_cfg_scale": scale,
        "width": on_grid(prompt.width, PIXEL_MULTIPLE),
        "height": on_grid(prompt.height, PIXEL_MULTIPLE),
    }
    if scale > 1:
        inputs["negative_prompt_embeds"] = negative
        inputs["negative_prompt_embeds_mask"] = _ones(negative)
    return inputs


def _ones(states: torch.Tensor) -> torch.Tensor:
    return torch.ones(states.shape[:2], dtype=torch.long, device=states.device)
