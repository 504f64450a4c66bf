"""FLUX.2's reference images (multi-reference editing): their latents' tokens follow the noisy
image's at T = 10, 20, ... as Flux2KleinPipeline places them, and only the image's tokens are
the prediction."""

from __future__ import annotations

import torch

from library.models.conditioning import TextConditioning
from library.models.families.base import REFERENCE_LATENTS_KEY
from library.models.families.flux2.family import flux2_family
from tests.kits.flux2.tiny import build_tiny_flux2_components


def test_predict_with_references_is_the_pipelines_transformer_call():
    from diffusers import Flux2KleinPipeline as P

    transformer = build_tiny_flux2_components(0)["transformer"]
    family = flux2_family("klein", "custom", False)
    gen = torch.Generator().manual_seed(1)
    channels = transformer.config.in_channels
    noisy = torch.randn(1, channels, 4, 3, generator=gen)
    refs = [
        torch.randn(1, channels, 2, 3, generator=gen),
        torch.randn(1, channels, 3, 2, generator=gen),
    ]
    text = torch.randn(1, 5, transformer.config.joint_attention_dim, generator=gen)
    sigma = torch.tensor([0.4])
    cond = family.assemble_conditioning(
        TextConditioning(text, None, None), {REFERENCE_LATENTS_KEY: refs}, "cpu"
    )
    with torch.no_grad():
        ours = family.predict(transformer, noisy, sigma, cond)
        latent_ids = P._prepare_latent_ids(noisy)
        ids = torch.cat([latent_ids, P._prepare_image_ids(refs)], dim=1)
        tokens = torch.cat([P._pack_latents(noisy), *(P._pack_latents(r) for r in refs)], dim=1)
        out = transformer(hidden_states=tokens, encoder_hidden_states=text, timestep=sigma,
                          img_ids=ids, txt_ids=P._prepare_text_ids(text), guidance=None,
                          return_dict=False)[0][:, :12]  # fmt: skip
        want = P._unpack_latents_with_ids(out, latent_ids)
        plain = family.predict(transformer, noisy, sigma, family.assemble_conditioning(
            TextConditioning(text, None, None), {}, "cpu"))  # fmt: skip
    assert torch.equal(ours, want)
    assert not torch.allclose(ours, plain)  # the references reach the prediction
