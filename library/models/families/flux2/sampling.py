"""Sampling FLUX.2 during training: diffusers' Flux2KleinPipeline / Flux2Pipeline fed our states.

The facts (diffusers 0.42.1): Euler over the folder's scheduler, the sigmas linspace(1, 1/N, N)
shifted by exp(mu) with mu = compute_empirical_mu(image tokens, N); klein base guides with
classifier-free guidance, neg + g * (pos - neg) for g > 1, the negative prompt's states given
(the pipeline's own default is the empty caption); distilled klein (``is_distilled``) runs no
guidance, and is sampled in about 4 steps; dev feeds g to its guidance embedding instead.
Image sides are rounded down to multiples of 16. A prompt's unset scale is 4 for klein base
and dev, 1 for distilled klein. A prompt's reference images go to the pipeline as ``image``: it
fits each to its area limit (1024 x 1024) on the 16-pixel grid and encodes it itself.
"""

from __future__ import annotations

from library.data.images import load_display_image
from library.models.families.base import REFERENCE_LATENTS_KEY as REFERENCES
from library.models.families.flux2.spec import PIPELINES
from library.sampling.pipelines import PipelineKind, on_grid, refuse_uncarried

SIZE_GRID = 16


def flux2_pipeline_kind(model: str, distilled: bool) -> PipelineKind:
    """The pipeline of ``model`` ("klein" or "dev") taking our conditioning."""
    guided = model == "klein" and not distilled

    def inputs(cond, prompt) -> dict:
        refuse_uncarried(cond, (REFERENCES,), PIPELINES[model])
        hidden = cond.encoder_hidden_states
        call = {
            "prompt_embeds": hidden[:1],
            "guidance_scale": float(prompt.scale),
            "width": on_grid(prompt.width, SIZE_GRID),
            "height": on_grid(prompt.height, SIZE_GRID),
        }
        if guided and prompt.scale > 1:
            call["negative_prompt_embeds"] = hidden[1:2]
        if prompt.references:  # the pipeline takes images, which it sizes and encodes itself
            call["image"] = [load_display_image(path) for path in prompt.references]
        return call

    options = {"is_distilled": distilled} if model == "klein" else {}
    scale = 1.0 if model == "klein" and distilled else 4.0
    return PipelineKind(
        PIPELINES[model],
        options=options,
        denoiser_argument="transformer",
        call_inputs=inputs,
        prompt_defaults={"sampler": "euler", "scale": scale},
    )
