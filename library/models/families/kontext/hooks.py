"""FLUX.1 Kontext [dev]'s hooks, which FLUX.1's family calls for its edit variant
(variant.py): the reference image's tokens and position ids, and the sampling pipeline. See
family.py for the facts they follow."""

from __future__ import annotations

from library.models.families.edit_variant import EditHooks
from library.models.families.flux.family import FluxFamily, image_position_ids, pack_latents
from library.models.families.kontext.sampling import REFERENCES, kontext_pipeline_kind

# The first position id of a reference image's tokens (the noisy image's are 0).
REFERENCE_INDEX = 1


def context_tokens(family: FluxFamily, cond, dtype):
    """The reference latents' packed tokens and their position ids (1, row, column)."""
    tokens, ids = [], []
    for latents in cond.unet_kwargs.get(REFERENCES, ()):
        height, width = latents.shape[-2:]
        tokens.append(pack_latents(latents.to(dtype)))
        position = image_position_ids(height, width, latents.device, dtype)
        position[:, 0] = REFERENCE_INDEX
        ids.append(position)
    return tokens, ids


# FluxKontextPipeline fed our conditioning and the prompt's reference latents
HOOKS = EditHooks(context=context_tokens, sampling_pipeline=lambda family: kontext_pipeline_kind())
