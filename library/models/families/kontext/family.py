"""FLUX.1 Kontext [dev]: FLUX.1 dev's transformer, taught to change a reference image as the
caption says.

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
from dataclasses import dataclass
from typing import ClassVar

from library.models.families.flux.family import (
    FLUX_DEV,
    FluxFamily,
    image_position_ids,
    pack_latents,
    with_flow,
)
from library.models.families.kontext.sampling import REFERENCES, kontext_pipeline_kind

# The first position id of a reference image's tokens (the noisy image's are 0).
REFERENCE_INDEX = 1


@dataclass(frozen=True, kw_only=True)
class FluxKontextFamily(FluxFamily):
    """FLUX.1 Kontext [dev] with the run's text and guidance settings."""

    FLOW_KIND: ClassVar[str] = "flux_kontext"
    LABEL: ClassVar[str] = "FLUX.1 Kontext"
    MODEL_TYPE: ClassVar[str] = "flux_kontext"
    # one reference image per sample, as the pipeline and musubi-tuner take it
    REFERENCE_IMAGES: ClassVar[tuple[int, int | None]] = (1, 1)

    def describe(self) -> str:
        return super().describe().replace("FLUX.1 dev", "FLUX.1 Kontext [dev]", 1)

    def context_tokens(self, cond, dtype):
        """The reference latents' packed tokens and their position ids (1, row, column)."""
        tokens, ids = [], []
        for latents in cond.unet_kwargs.get(REFERENCES, ()):
            height, width = latents.shape[-2:]
            tokens.append(pack_latents(latents.to(dtype)))
            position = image_position_ids(height, width, latents.device, dtype)
            position[:, 0] = REFERENCE_INDEX
            ids.append(position)
        return tokens, ids

    def sampling_pipeline(self):
        """FluxKontextPipeline fed our conditioning and the prompt's reference latents."""
        return kontext_pipeline_kind()


# FLUX.1 dev's settings under Kontext's names
FLUX_KONTEXT = FluxKontextFamily(
    **{
        **{f.name: getattr(FLUX_DEV, f.name) for f in dataclasses.fields(FLUX_DEV)},
        "name": "flux-kontext-dev",
        "modelspec_architecture": "flux-1-kontext-dev",
        "base_model_version": "flux1_kontext",
    }
)


def kontext_family(flow) -> FluxKontextFamily:
    """FLUX.1 Kontext [dev] with the [flow] section's text and guidance settings."""
    return with_flow(FLUX_KONTEXT, flow)
