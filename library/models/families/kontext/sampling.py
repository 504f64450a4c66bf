"""Sampling FLUX.1 Kontext during training: diffusers' FluxKontextPipeline fed our conditioning
and the prompt's reference latents.

The pipeline takes the reference as ``image``; given latents (as many channels as the AE's), it
uses them as they are, so the reference is encoded once, as the training step encodes it. It
resizes the generated image to ``max_area`` at the requested aspect ratio (1024x1024 by default)
and the reference to one of Kontext's preferred sizes unless ``_auto_resize`` is off: the prompt's
own size (max_area = its area) and the reference latents as given keep both as asked.
Everything else is FLUX.1 dev's (flux/sampling.py).
"""

from __future__ import annotations

import dataclasses

from library.models.conditioning import Conditioning
from library.models.families.base import REFERENCE_LATENTS_KEY as REFERENCES
from library.models.families.flux.sampling import flux_pipeline_inputs, flux_pipeline_kind

# The conditioning input REFERENCES carries the reference latents (one [B, C, h, w] tensor per
# reference) from FLUX.1's assemble_conditioning to Kontext's context tokens and the pipeline.
PIPELINE = "FluxKontextPipeline"


def kontext_pipeline_kind():
    """FluxKontextPipeline with FLUX.1 dev's prompt defaults."""
    return dataclasses.replace(
        flux_pipeline_kind(guidance=True), class_name=PIPELINE, call_inputs=kontext_inputs
    )


def kontext_inputs(cond: Conditioning, prompt) -> dict:
    """FLUX.1's call keywords, the prompt's reference latents as ``image`` and its size kept."""
    kwargs = dict(cond.unet_kwargs)
    references = kwargs.pop(REFERENCES, None)
    inputs = flux_pipeline_inputs(Conditioning(cond.encoder_hidden_states, kwargs), prompt)
    if references:
        (latents,) = references  # Kontext takes one reference
        inputs |= {"image": latents[:1], "_auto_resize": False}
    inputs["max_area"] = inputs["width"] * inputs["height"]
    return inputs
