"""Flux.1's micro-batch loss: the T5 mask against the plain computation (the FLUX.1 kit's
reference_loss: diffusers' FluxPipeline for the text, packing and position ids, and the
rectified-flow formulas; the conformance suite's test_loss_equals_a_plain_reference checks each
timestep_sampling scheme and model_prediction_type with it), per-sample draws, refused and
ignored options."""

from __future__ import annotations

import pytest
import torch
from cpu_inputs import FLOW_BATCH, cpu_inputs, flow_pixels
from flux_fixtures import plain_flux_pipeline, tiny_flux_components

from library.errors import ConfigError
from library.training.loss import LossOptions
from library.training.noise import NoiseOptions
from library.training.step import micro_batch_loss
from tests.kits.flux.kit import reference_loss

SEED = 11
BATCH = FLOW_BATCH


def test_a_masked_t5_padding_is_as_if_there_were_no_padding():
    """apply_t5_attn_mask: T5 and every joint attention ignore the padding, so each sample's loss
    equals the loss with its caption encoded at exactly its own length (no padding at all)."""
    c = tiny_flux_components(model_prediction_type="raw", apply_t5_attn_mask=True)
    pixels = flow_pixels()
    with torch.no_grad():
        ours = micro_batch_loss(cpu_inputs(c, SEED), {**BATCH, "pixel_values": pixels})
        unmasked = tiny_flux_components(model_prediction_type="raw")
        padded = micro_batch_loss(cpu_inputs(unmasked, SEED), {**BATCH, "pixel_values": pixels})
        expected = 0.0
        for i, caption in enumerate(BATCH["captions"]):
            length = len(c.tokenizers[1](caption).input_ids)  # its tokens and </s>
            one = {"captions": [caption], "loss_weights": BATCH["loss_weights"][i : i + 1],
                   "positions": BATCH["positions"][i : i + 1], "epoch": BATCH["epoch"]}  # fmt: skip
            one["pixel_values"] = pixels[i : i + 1]
            pipe = plain_flux_pipeline(c)
            expected += reference_loss(pipe, one, SEED, "sigma", "raw", length).item() / 2
    assert ours.item() == pytest.approx(expected, rel=1e-5)
    assert padded.item() != pytest.approx(expected, rel=1e-3)  # the padding does matter


def test_the_loss_is_per_sample_and_schnell_takes_no_guidance():
    """Each sample's draws follow its position, not its batch; schnell runs without guidance."""
    c = tiny_flux_components("schnell", model_prediction_type="raw")
    pixels = flow_pixels()
    inputs = cpu_inputs(c, SEED)
    with torch.no_grad():
        together = micro_batch_loss(inputs, {**BATCH, "pixel_values": pixels})
        singles = [
            micro_batch_loss(
                inputs,
                {
                    "pixel_values": pixels[i : i + 1],
                    "captions": BATCH["captions"][i : i + 1],
                    "loss_weights": BATCH["loss_weights"][i : i + 1],
                    "positions": BATCH["positions"][i : i + 1],
                    "epoch": BATCH["epoch"],
                },
            )  # fmt: skip
            for i in range(2)
        ]
    assert together.item() == pytest.approx(sum(s.item() for s in singles) / 2, rel=1e-5)


def test_huber_snr_schedule_and_a_narrow_timestep_range_are_refused():
    c = tiny_flux_components()
    with pytest.raises(ConfigError, match="huber_schedule"):
        cpu_inputs(c, SEED, loss=LossOptions(loss_type="huber"))
    with pytest.raises(ConfigError, match="max_timestep"):
        cpu_inputs(c, SEED, noise=NoiseOptions(max_timestep=500))
    cpu_inputs(c, SEED, noise=NoiseOptions(max_timestep=1000))  # the whole range: what GUIs write


def test_ddpm_only_keys_are_left_out_with_a_warning(caplog):
    """GUI presets for Flux carry min_snr_gamma and noise_offset; sd-scripts ignores them for
    Flux.1, and so does difftune, saying so."""
    c = tiny_flux_components(model_prediction_type="raw")
    batch = {**BATCH, "pixel_values": flow_pixels()}
    plain = cpu_inputs(c, SEED)
    with caplog.at_level("WARNING"):
        gui = cpu_inputs(c, SEED, loss=LossOptions(min_snr_gamma=7.0),
                         noise=NoiseOptions(noise_offset=0.05))  # fmt: skip
    assert "min_snr_gamma = 7.0, noise_offset = 0.05" in caplog.text
    with torch.no_grad():
        assert micro_batch_loss(gui, batch).item() == micro_batch_loss(plain, batch).item()
