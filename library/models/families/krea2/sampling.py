"""Samples through diffusers' Krea2Pipeline fed our conditioning: Euler over the folder's
scheduler (resolution-aware shift; Turbo, the pipeline's ``is_distilled``: mu = 1.15). Its
guidance is cond + g (cond - uncond), on when g > 0: the usual CFG at scale 1 + g, so a prompt's
``scale`` s (musubi-tuner's ``--l``) is g = s - 1; unset, 5.5 (the pipeline's 4.5) for RAW, 1
(none) for Turbo. Sides are rounded down to multiples of 16."""

from __future__ import annotations

import torch

from library.models.families.krea2.spec import PIXEL_MULTIPLE
from library.sampling.pipelines import PipelineKind, on_grid

LENGTHS = "caption_lengths"  # the conditioning entry of each caption's own length


def krea2_pipeline_kind(taps: tuple[int, ...], distilled: bool) -> PipelineKind:
    return PipelineKind(
        "Krea2Pipeline",
        options={"text_encoder_select_layers": taps, "is_distilled": distilled},
        denoiser_argument="transformer",
        call_inputs=krea2_pipeline_inputs,
        prompt_defaults={"sampler": "euler", "scale": 1.0 if distilled else 5.5},
    )


def krea2_pipeline_inputs(cond, prompt) -> dict:
    """Call keywords from the conditioning of [prompt, negative prompt]: both at one width
    (the pipeline gives them the same positions), each with the mask of its own length."""
    extra = sorted(set(cond.unet_kwargs) - {LENGTHS})
    if extra:
        raise ValueError(f"no Krea2Pipeline argument carries the conditioning input {extra[0]!r}")
    hidden = cond.encoder_hidden_states
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
        inputs |= {"negative_prompt_embeds": hidden[1:2], "negative_prompt_embeds_mask": masks[1:2]}
    return inputs
