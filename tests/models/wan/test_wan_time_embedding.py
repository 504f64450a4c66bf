"""musubi-tuner's force_v2_1_time_embedding embeds a Wan 2.2 model's time once per sample (Wan
2.1's way) instead of once per token. Where every token shares its sample's time (text to video,
each model difftune trains) both give the same output, which is why the word is accepted and
ignored; per-token times that differ (Wan 2.2 TI2V's clean first frame) would change it."""

from __future__ import annotations

import torch

from tests.kits.wan.tiny import transformer_config


def _outputs(timestep: torch.Tensor) -> torch.Tensor:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(**transformer_config()).eval()
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 3, 4, 4, generator=gen)
    text = torch.randn(1, 5, transformer_config()["text_dim"], generator=gen)
    with torch.no_grad():
        return model(latents, timestep, text, return_dict=False)[0]


def test_one_time_per_sample_equals_the_same_time_on_every_token():
    tokens = 3 * 2 * 2  # latent frames x (4 / 2) x (4 / 2) patches
    per_sample = _outputs(torch.tensor([700.0]))
    per_token = _outputs(torch.full((1, tokens), 700.0))
    torch.testing.assert_close(per_token, per_sample, rtol=0, atol=1e-6)
    first_frame_clean = torch.full((1, tokens), 700.0)
    first_frame_clean[:, :4] = 0.0
    assert (_outputs(first_frame_clean) - per_sample).abs().max() > 1e-3
