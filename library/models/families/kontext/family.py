"""FLUX.1 Kontext [dev]: FLUX.1 dev's transformer, taught to change a reference image as the
caption says. No family class of its own: FLUX.1's family with Kontext's edit variant
(variant.py) and its hooks (hooks.py), which FLUX.1's family calls.

The facts (diffusers' FluxKontextPipeline in the pinned version, Black Forest Labs' release):

- the model, its text encoders (CLIP-L, T5-XXL), its AE and its objective are FLUX.1 dev's, with
  the distilled guidance input;
- the reference image is encoded by the AE with the posterior's mode (``sample_mode="argmax"``),
  shifted and scaled like the target's latents, cut into 2x2 patches like them, and its tokens
  are appended after the noisy image's in the transformer's image sequence; their position ids
  are (1, row, column) where the noisy image's are (0, row, column);
- the transformer's output for the reference tokens is dropped: the prediction is the output
  for the noisy image's tokens alone.
"""

from __future__ import annotations

import dataclasses

from library.models.families.flux.family import FLUX_DEV, FluxFamily, with_flow
from library.models.families.kontext.variant import EDIT

# FLUX.1 dev's settings under Kontext's names
FLUX_KONTEXT = dataclasses.replace(
    FLUX_DEV,
    name="flux-kontext-dev",
    modelspec_architecture="flux-1-kontext-dev",
    base_model_version="flux1_kontext",
    edit=EDIT,
)


def kontext_family(flow) -> FluxFamily:
    """FLUX.1 Kontext [dev] with the [flow] section's text and guidance settings."""
    return with_flow(FLUX_KONTEXT, flow)
