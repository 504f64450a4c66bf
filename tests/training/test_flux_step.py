"""Flux.1's micro-batch loss against a plain computation: diffusers' FluxPipeline for the text,
packing and position ids, and the rectified-flow formulas written out for each of kohya's
timestep_sampling schemes and model_prediction_types."""

from __future__ import annotations

import math

import pytest
import torch
from cpu_inputs import FLOW_BATCH, cpu_inputs, flow_pixels
from flux_fixtures import plain_flux_pipeline, tiny_flux_components

from library.errors import ConfigError
from library.training.loss import LossOptions
from library.training.noise import NoiseOptions, draw
from library.training.step import micro_batch_loss

SEED = 11
BATCH = FLOW_BATCH


def _sigma(scheme: str, z: torch.Tensor, u: torch.Tensor, shape) -> torch.Tensor:
    """kohya's Flux sigma for each scheme, written from the formulas (defaults: scale 1,
    shift 3, uniform density)."""
    if scheme == "uniform":
        return u
    if scheme == "sigmoid":
        return torch.sigmoid(z)
    if scheme == "shift":
        t = torch.sigmoid(z)
        return 3 * t / (1 + 2 * t)
    if scheme == "flux_shift":
        tokens = (shape[-2] // 2) * (shape[-1] // 2)
        mu = 0.5 + (1.15 - 0.5) * (tokens - 256) / (4096 - 256)
        t = torch.sigmoid(z)
        return math.exp(mu) / (math.exp(mu) + (1 / t - 1))
    # "sigma": index floor(1000 u) of the descending shifted table sigma_k = shift(1 - k / 1000)
    k = torch.floor(u * 1000).clamp(max=999)
    t = 1 - k / 1000
    return 3 * t / (1 + 2 * t)


def _reference(c, pixels, scheme: str, prediction: str, batch=BATCH, t5_length=512) -> torch.Tensor:
    pipe = plain_flux_pipeline(c)
    with torch.no_grad():
        posterior = c.vae.encode(pixels).latent_dist
        shape = tuple(posterior.mean.shape[1:])
        d = draw(SEED, batch["epoch"], batch["positions"].tolist(), shape, 1000,
                 torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
        sample = posterior.mean + posterior.std * d.latent_eps
        x0 = (sample - c.vae.config.shift_factor) * c.vae.config.scaling_factor
        sigma = _sigma(scheme, d.time_normal, d.time_uniform, shape).view(-1, 1, 1, 1)
        xt = (1 - sigma) * x0 + sigma * d.noise
        text, pooled, text_ids = pipe.encode_prompt(
            batch["captions"], None, max_sequence_length=t5_length
        )
        b, ch, h, w = xt.shape
        packed = pipe._pack_latents(xt, b, ch, h, w)
        image_ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, xt.device, xt.dtype)
        guidance = torch.full((b,), 3.5)
        out = c.denoiser(hidden_states=packed, encoder_hidden_states=text, pooled_projections=pooled,
                         timestep=sigma.view(-1), img_ids=image_ids, txt_ids=text_ids,
                         guidance=guidance).sample  # fmt: skip
        v = pipe._unpack_latents(out, h * 8, w * 8, 8)
        pred = {"raw": v, "additive": v + xt, "sigma_scaled": xt - sigma * v}[prediction]
        per_sample = ((pred - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3))
        return (per_sample * batch["loss_weights"]).mean()


@pytest.mark.parametrize("scheme", ["sigma", "uniform", "sigmoid", "shift", "flux_shift"])
def test_each_timestep_sampling_matches_the_formulas(scheme):
    c = tiny_flux_components(timestep_sampling=scheme, model_prediction_type="raw")
    batch = {**BATCH, "pixel_values": flow_pixels()}
    with torch.no_grad():
        ours = micro_batch_loss(cpu_inputs(c, SEED), batch)
    expected = _reference(c, batch["pixel_values"], scheme, "raw")
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("prediction", ["raw", "additive", "sigma_scaled"])
def test_each_model_prediction_type_matches_the_formulas(prediction):
    c = tiny_flux_components(timestep_sampling="shift", model_prediction_type=prediction)
    batch = {**BATCH, "pixel_values": flow_pixels()}
    with torch.no_grad():
        ours = micro_batch_loss(cpu_inputs(c, SEED), batch)
    expected = _reference(c, batch["pixel_values"], "shift", prediction)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


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
            expected += _reference(c, pixels[i : i + 1], "sigma", "raw", one, length).item() / 2
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
