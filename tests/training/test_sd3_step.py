"""SD3's micro-batch loss against a plain computation (the SD3 kit's reference_loss:
diffusers' StableDiffusion3Pipeline for the text, kohya's SD3 formulas written out; the
conformance suite's test_loss_equals_a_plain_reference checks each weighting scheme, training
shift and variant with it): encoder dropout, sigma_sqrt at 0, the timestep range, position
crops."""

from __future__ import annotations

import pytest
import torch
from cpu_inputs import FLOW_BATCH, cpu_inputs, flow_pixels
from sd3_fixtures import plain_sd3_pipeline, tiny_sd3_components

from library.training.loss import LossOptions
from library.training.noise import CONDITIONING_STREAM, NoiseOptions, draw, keyed_uniforms
from library.training.step import micro_batch_loss
from tests.kits.sd3.kit import reference_loss

SEED = 11
BATCH = FLOW_BATCH


def _reference(c, pixels, scheme, batch=BATCH, zero=()) -> torch.Tensor:
    """kohya's sd3_train_network loss, written out on diffusers' pipeline over ``c``'s modules;
    ``zero`` names encoder parts dropped for every sample ("l", "g", "t5")."""
    with torch.no_grad():
        return reference_loss(plain_sd3_pipeline(c), {**batch, "pixel_values": pixels}, SEED,
                              scheme, zero=zero)  # fmt: skip


@pytest.mark.parametrize("part", ["l", "g", "t5"])
def test_a_dropout_rate_of_one_zeroes_that_encoders_part(part):
    key = {"l": "clip_l_dropout_rate", "g": "clip_g_dropout_rate", "t5": "t5_dropout_rate"}[part]
    c = tiny_sd3_components(**{key: 1.0})
    batch = {**BATCH, "pixel_values": flow_pixels()}
    with torch.no_grad():
        ours = micro_batch_loss(cpu_inputs(c, SEED), batch)
    assert ours.item() == pytest.approx(
        _reference(c, batch["pixel_values"], "uniform", zero=(part,)).item(), rel=1e-5
    )
    assert ours.item() != pytest.approx(
        _reference(c, batch["pixel_values"], "uniform").item(), rel=1e-4
    )


def test_dropout_follows_each_samples_keyed_draw_whatever_the_batch():
    """Rate 0.5 on all three: which parts a sample loses comes from its own keyed stream, so
    the batch of two equals the two samples alone, and equals the reference per sample."""
    c = tiny_sd3_components(clip_l_dropout_rate=0.5, clip_g_dropout_rate=0.5, t5_dropout_rate=0.5)
    pixels = flow_pixels()
    inputs = cpu_inputs(c, SEED)
    draws = keyed_uniforms(SEED, BATCH["epoch"], BATCH["positions"].tolist(), 3,
                           CONDITIONING_STREAM, "cpu")  # fmt: skip
    expected = 0.0
    with torch.no_grad():
        together = micro_batch_loss(inputs, {**BATCH, "pixel_values": pixels})
        singles = []
        for i in range(2):
            one = {"captions": BATCH["captions"][i : i + 1], "epoch": BATCH["epoch"],
                   "loss_weights": BATCH["loss_weights"][i : i + 1],
                   "positions": BATCH["positions"][i : i + 1]}  # fmt: skip
            singles.append(micro_batch_loss(inputs, {**one, "pixel_values": pixels[i : i + 1]}))
            dropped = tuple(
                p for p, u in zip(("l", "g", "t5"), draws[i].tolist(), strict=True) if u < 0.5
            )
            expected += _reference(c, pixels[i : i + 1], "uniform", batch=one, zero=dropped).item()
    assert together.item() == pytest.approx(sum(s.item() for s in singles) / 2, rel=1e-5)
    assert together.item() == pytest.approx(expected / 2, rel=1e-5)


def test_sigma_sqrt_at_sigma_zero_weighs_zero_instead_of_nan():
    """sigma 0 (density below 1/1000) makes sigma^-2 infinite; the x0 prediction is exact there,
    so the sample contributes 0 rather than sd-scripts' NaN."""
    c = tiny_sd3_components(weighting_scheme="sigma_sqrt")
    levels = torch.tensor([0.0, 0.5])
    weights = c.objective.level_weights(LossOptions(), levels)
    assert weights.tolist() == [0.0, 4.0]


def test_min_max_timestep_narrow_the_draw_and_ip_noise_is_left_out(caplog):
    c = tiny_sd3_components()
    with caplog.at_level("WARNING"):
        inputs = cpu_inputs(c, SEED, noise=NoiseOptions(min_timestep=400, max_timestep=600,
                                                        ip_noise_gamma=0.1))  # fmt: skip
    assert "ip_noise_gamma = 0.1" in caplog.text
    assert inputs.noise.ip_noise_gamma == 0
    d = draw(SEED, 0, list(range(64)), (16, 8, 8), 1000, torch.device("cpu"), inputs.noise,
             flow_times=True)  # fmt: skip
    sigmas = c.objective.levels(d, (16, 8, 8))
    assert sigmas.min() >= 0.4 and sigmas.max() < 0.6
    expected = torch.floor(d.time_uniform * 200 + 400) / 1000
    assert torch.equal(sigmas, expected)


def test_position_crops_follow_each_samples_keyed_draws():
    """pos_emb_random_crop_rate 1: every sample crops the position table where its own keyed
    draws say, so the batch of two equals the two samples alone, and differs from no crops."""
    from library.models.families.sd3.position import install

    c = tiny_sd3_components(pos_emb_random_crop_rate=1.0)
    install(c.denoiser, 1.0)
    inputs = cpu_inputs(c, SEED)
    pixels = flow_pixels()
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
    assert together.item() != pytest.approx(_reference(c, pixels, "uniform").item(), rel=1e-4)
