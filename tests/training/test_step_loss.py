"""micro_batch_loss of SD 1.x/2.x: options checked against the model, and a batch's loss is the
mean of its samples' (the loss against a plain-PyTorch computation, with min-SNR, noise offset,
multires and input-perturbation noise, Huber and debiased estimation, is the SD kit's case of
the conformance suite's test_loss_equals_a_plain_reference)."""

import pytest
import torch
from cpu_inputs import cpu_inputs

from library.config.schema import ModelSection, TrainingSection
from library.errors import ConfigError
from library.models.loader import load_components
from library.training.loss import LossOptions
from library.training.noise import NoiseOptions
from library.training.step import micro_batch_loss


def _setup(request, which):
    model_dir = request.getfixturevalue(
        "tiny_model_dir" if which == "sd1" else "tiny_sd2v_model_dir"
    )
    c = load_components(ModelSection(pretrained_model_name_or_path=str(model_dir)), torch.float32)
    torch.manual_seed(3)
    batch = {
        "pixel_values": torch.rand(3, 3, 64, 64) * 2 - 1,
        "captions": ["a red circle", "shape", "a blue square on gray"],
        "loss_weights": torch.tensor([1.0, 0.5, 1.0]),
        "positions": torch.tensor([4, 0, 9]),
        "epoch": 2,
    }
    return c, batch


def _inputs(c, **options):
    return cpu_inputs(c, 11, **options)


def test_options_are_checked_against_the_model(request):
    c, _ = _setup(request, "sd1")
    with pytest.raises(ConfigError, match="scale_v_pred_loss_like_noise_pred"):
        _inputs(c, loss=LossOptions(scale_v_pred_loss_like_noise_pred=True))
    with pytest.raises(ConfigError, match="max_timestep"):
        _inputs(c, noise=NoiseOptions(max_timestep=1200))


def _one(batch, i):
    return {k: v if k == "epoch" else v[i : i + 1] for k, v in batch.items()}


def test_batch_loss_is_the_mean_of_single_sample_losses_with_every_option(request):
    """Layout invariance end to end: no option mixes samples of a micro-batch."""
    c, batch = _setup(request, "sd1")
    training = TrainingSection(
        noise_offset=0.1,
        noise_offset_random_strength=True,
        adaptive_noise_scale=0.02,
        multires_noise_iterations=4,
        ip_noise_gamma=0.1,
        ip_noise_gamma_random_strength=True,
        min_timestep=50,
        max_timestep=950,
        loss_type="smooth_l1",
        huber_schedule="exponential",
        debiased_estimation_loss=True,
        v_pred_like_loss=0.1,
    )
    inputs = _inputs(
        c, noise=NoiseOptions.from_training(training), loss=LossOptions.from_training(training)
    )
    with torch.no_grad():
        together = micro_batch_loss(inputs, batch)
        singles = [micro_batch_loss(inputs, _one(batch, i)) for i in range(3)]
    assert torch.allclose(together, torch.stack(singles).mean(), rtol=1e-4)
