"""Wan trained on clips of F > 1 frames: the trainer's micro-batch loss on a batch of clips
[B, 3, F, H, W] equals the loss written out from WanPipeline's parts (the VAE's encoding of the
clip, 1 + (F - 1) / 4 latent frames, the transformer over all of them)."""

from __future__ import annotations

import torch

from library.models.families.wan.family import WanFamily
from library.training.step import micro_batch_loss
from tests.kits.wan.kit import reference_loss
from tests.models.step_inputs import step_inputs

SEED = 11


def _batch(frames: int) -> dict:
    gen = torch.Generator().manual_seed(5)
    return {
        "captions": ["a red circle moving right", "a much longer caption about a moving shape"],
        "pixel_values": torch.rand(2, 3, frames, 32, 48, generator=gen) * 2 - 1,
        "loss_weights": torch.tensor([1.0, 0.5]),
        "positions": torch.tensor([3, 8]),
        "epoch": 2,
        "original_sizes": torch.tensor([[32, 48], [32, 48]]),
        "crop_top_lefts": torch.tensor([[0, 0], [0, 0]]),
        "target_sizes": torch.tensor([[32, 48], [32, 48]]),
    }


def test_clip_loss_equals_the_pipelines_parts(kit_folders):
    from diffusers import WanPipeline

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    assert WanFamily.TRAINS_CLIPS
    folder = kit_folders("wan", "t2v")
    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    components = load_components(ModelSection(pretrained_model_name_or_path=str(folder)),
                                 torch.float32, FlowSection())  # fmt: skip
    inputs = step_inputs(components, SEED)
    batch = _batch(5)
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
        expected = reference_loss(pipe, batch, SEED)
        latents = pipe.vae.encode(batch["pixel_values"]).latent_dist.mean
        # the frames reach the loss: the same clip with its frames reversed gives another
        reversed_ = micro_batch_loss(
            inputs, {**batch, "pixel_values": batch["pixel_values"].flip(2)}
        )
    assert latents.shape[2] == 2  # 1 + (5 - 1) / 4 latent frames
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(ours, reversed_)
