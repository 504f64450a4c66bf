"""Z-Image wired into the trainer: its folder loads through the registry, and the trainer's
micro-batch loss with the text cache equals the plain computation from diffusers' ZImagePipeline
(the Z-Image kit's reference_loss; the conformance suite checks it without the cache and with
the flow keys)."""

from __future__ import annotations

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError
from library.models.families.zimage.family import ZImageFamily
from library.models.loader import load_components
from library.training.step import StepInputs, micro_batch_loss
from library.training.text_cache import TextEncoderCache
from tests.kits.zimage.kit import reference_loss
from tests.kits.zimage.tiny import write_tiny_zimage_folder

SEED = 11
BATCH = {
    "captions": ["a red circle", "a much longer caption about a shape on gray paper"],
    "loss_weights": torch.tensor([1.0, 0.5]),
    "positions": torch.tensor([3, 8]),
    "epoch": 2,
}


def pixels() -> torch.Tensor:
    """Two 48 x 64 images in [-1, 1]."""
    return torch.rand(2, 3, 64, 48, generator=torch.Generator().manual_seed(5)) * 2 - 1


def load(folder, **flow) -> object:
    model = ModelSection(pretrained_model_name_or_path=str(folder))
    return load_components(model, torch.float32, FlowSection(**flow))


@pytest.fixture(scope="module")
def components(zimage_dir):
    return load(zimage_dir)


def inputs(c, **options) -> StepInputs:
    return StepInputs(
        denoiser=c.denoiser, vae=c.vae, family=c.family, objective=c.objective,
        text_encoders=c.text_encoders, tokenizers=c.tokenizers, train_text_encoder=False,
        weight_dtype=torch.float32, device=torch.device("cpu"), seed=SEED, **options,
    )  # fmt: skip


def test_the_folder_loads_as_z_image(components, tmp_path):
    c = components
    assert isinstance(c.family, ZImageFamily) and c.family.variant == "turbo"
    assert c.family.sampling_shift == 3.0 and c.family.lora_architecture == "Z-Image/lora"
    assert type(c.text_encoders[0]).__name__ == "Qwen3Model"
    base = load(write_tiny_zimage_folder(tmp_path / "base", "base"))
    assert (base.family.variant, base.family.sampling_shift) == ("base", 6.0)


def test_cached_text_trains_like_fresh_text(components, zimage_pipe):
    """The text cache holds each caption at its own length and pads the batch again."""
    batch = {**BATCH, "pixel_values": pixels()}
    cache = TextEncoderCache("zimage-test", to_disk=False)
    first = micro_batch_loss(inputs(components, text_cache=cache), batch)
    again = micro_batch_loss(inputs(components, text_cache=cache), batch)
    assert cache.encoded == 2
    lengths = [entry[0].shape[0] for entry in cache._memory.values()]
    assert len(set(lengths)) == 2  # stored unpadded
    with torch.no_grad():
        expected = reference_loss(zimage_pipe, batch, SEED)
    for loss in (first, again):
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=0)


def test_flux_only_flow_keys_are_refused(zimage_dir):
    with pytest.raises(ConfigError, match="model_prediction_type is a FLUX.1 or FLUX.1 Kontext or Chroma key"):
        load(zimage_dir, model_prediction_type="raw")


def test_encode_text_gives_each_captions_own_states(components, zimage_pipe):
    c = components
    with torch.no_grad():
        text = c.family.encode_text(c.tokenizers, c.text_encoders, BATCH["captions"], "cpu")
        states, _ = zimage_pipe.encode_prompt(BATCH["captions"], do_classifier_free_guidance=False)
    assert text.lengths.tolist() == [len(s) for s in states]
    for row, n, expected in zip(text.hidden, text.lengths, states, strict=True):
        assert torch.equal(row[:n], expected)
        assert not row[n:].any()
