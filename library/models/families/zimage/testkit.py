"""Z-Image's kit for the family conformance suite (library.models.families.testkit).

Turbo and Base are one architecture (their tiny models are the same modules; the folders differ
in the scheduler's shift, which the loader reads to tell them apart). What the suite's
properties cannot ask of Z-Image is said in ``skips``.
"""

from __future__ import annotations

import torch

from library.models.families.testkit import ConformanceKit, NameTable
from library.models.families.zimage import keys
from library.models.families.zimage.family import zimage_family
from library.models.families.zimage.shapes import SCHEDULER_SHIFT, VARIANTS
from library.models.families.zimage.tiny import (
    build_tiny_zimage_components,
    write_tiny_zimage_folder,
)


def _reference_transformer(original, config):
    """diffusers' converter (on the keys as they are inside a full checkpoint), which pops every
    key it reads: none may be left."""
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers,
    )

    checkpoint = {keys.CHECKPOINT_PREFIX + k: v for k, v in original.items()}
    converted = convert_z_image_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _family(variant, modules):

    return zimage_family(variant, SCHEDULER_SHIFT[variant])


def _inputs(transformer, seed):
    """One image (a one-frame 8 x 8 latent) and one caption of 7 tokens, as lists: the
    transformer takes one tensor per image and per caption."""
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": [torch.randn(config.in_channels, 1, 8, 8, generator=gen)],
        "t": torch.tensor([0.3]),
        "cap_feats": [torch.randn(7, config.cap_feat_dim, generator=gen)],
    }


KIT = ConformanceKit(
    variants=VARIANTS,
    build=lambda variant, seed: build_tiny_zimage_components(seed),
    write_folder=write_tiny_zimage_folder,
    pipeline=lambda variant: "ZImagePipeline",
    family=_family,
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: keys.diffusers_to_original(state),
        from_original=lambda original, config: keys.original_to_diffusers(original),
        reference=_reference_transformer,
    ),
    skips={
        "vae_names": (
            "Z-Image's VAE is FLUX.1's AE, read from the folder's vae/ in diffusers' names; "
            "FLUX.1's kit checks that AE's original-layout name table"
        ),
        "lycoris_fused": (
            "Z-Image's LyCORIS files name each diffusers Linear (to_q, to_k, to_v apart), no "
            "fused original layer; ComfyUI's merge of them into the original qkv is checked in "
            "tests/models/zimage/test_zimage_comfy_keys.py"
        ),
    },
)
