"""Sampling Krea 2 during training: diffusers' Krea2Pipeline fed our conditioning.

The facts (diffusers 0.42.1 Krea2Pipeline): Euler over the folder's scheduler with the
resolution-aware shift, or Turbo's fixed mu = 1.15 when the pipeline's ``is_distilled`` is set;
guidance as ``cond + g (cond - uncond)``, on when g > 0, which is the usual CFG at scale
s = 1 + g. A prompt's ``scale`` is s (as in musubi-tuner's ``--l``): above 1 the negative
prompt is run; unset, 5.5 (the pipeline's g = 4.5) for RAW and 1 (no guidance) for Turbo. Image
sides are rounded down to multiples of 16.
"""

from __future__ import annotations

import torch

from library.models.conditioning import Conditioning
from library.models.families.krea2.spec import PIXEL_MULTIPLE
from library.sampling.pipelines import PipelineKind, on_grid

LENGTHS = "caption_lengths"  # the conditioning entry of each caption's own length
RAW_SCALE = 5.5  # the pipeline's guidance_scale 4.5, as CFG scale
TURBO_SCALE = 1.0


def krea2_pipeline_kind(taps: tuple[int, ...], distilled: bool) -> PipelineKind:
    """Krea2Pipeline with the model's taps and schedule, taking our conditioning."""
    return PipelineKind(
        "Krea2Pipeline",
        options={"text_encoder_select_layers": taps, "is_distilled": distilled},
        denoiser_argument="transformer",
        call_inputs=krea2_pipeline_inputs,
        prompt_defaults={"sampler": "euler", "scale": TURBO_SCALE if distilled else RAW_SCALE},
    )


def krea2_pipeline_inputs(cond: Conditioning, prompt) -> dict:
    """Krea2Pipeline call keywords from the conditioning of [prompt, negative prompt]: each
    caption's states at the longer one's width with the mask of its own length, guidance_scale = scale - 1 (the
    negative only above scale 1) and the 16-pixel size."""
    extra = sorted(set(cond.unet_kwargs) - {LENGTHS})
    if extra:
        raise ValueError(f"no Krea2Pipeline argument carries the conditioning input {extra[0]!r}")
    hidden = cond.encoder_hidden_states
    # The pipeline gives both captions the same positions: one width, each row its own mask.
    masks = torch.arange(hidden.shape[1])[None, :] < cond.unet_kwargs[LENGTHS].reshape(-1, 1)
    masks = masks.to(hidden.device)
    guidance = max(float(prompt.scale) - 1.0, 0.0)
    inputs = {
        "prompt_embeds": hidden[:1],
        "prompt_embeds_mask": masks[:1],
        "guidance_scale": guidance,
        "width": on_grid(prompt.width, PIXEL_MULTIPLE),
        "height": on_grid(prompt.height, PIXEL_MULTIPLE),
    }
    if guidance > 0:
        inputs["negative_prompt_embeds"] = hidden[1:2]
        inputs["negative_prompt_embeds_mask"] = masks[1:2]
    return inputs


def _ones(states: torch.Tensor) -> torch.Tensor:
    return torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)
