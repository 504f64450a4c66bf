"""micro_batch_loss against a plain-PyTorch computation of the same diffusion loss."""

import pytest
import torch

from library.config.schema import ModelSection
from library.models.loader import load_components
from library.training.noise import draw
from library.training.step import StepInputs, micro_batch_loss


def _reference_loss(c, batch, seed, noise_offset, gamma):
    """The textbook loss, written out: x_t = sqrt(a) x0 + sqrt(1-a) eps; v = sqrt(a) eps - sqrt(1-a) x0."""
    with torch.no_grad():
        posterior = c.vae.encode(batch["pixel_values"]).latent_dist
        shape = tuple(posterior.mean.shape[1:])
        d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000, torch.device("cpu"))
        x0 = (posterior.mean + posterior.std * d.latent_eps) * c.vae.config.scaling_factor
        eps = d.noise + noise_offset * d.offset
        betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
        a = torch.cumprod(1 - betas, 0)[d.timesteps].float().view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
        ids = c.tokenizer(batch["captions"], padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        hidden = c.text_encoder(ids)[0]
        pred = c.unet(xt, d.timesteps, hidden).sample
        v_pred = c.family.prediction_type == "v_prediction"
        target = a.sqrt() * eps - (1 - a).sqrt() * x0 if v_pred else eps
        snr = (a / (1 - a)).view(-1)
        snr_w = torch.clamp(snr, max=gamma) / (snr + 1 if v_pred else snr) if gamma else torch.ones_like(snr)
        per_sample = ((pred - target) ** 2).mean(dim=(1, 2, 3))
        return (per_sample * batch["loss_weights"] * snr_w).mean()


@pytest.mark.parametrize("which", ["sd1", "sd2v"])
@pytest.mark.parametrize("gamma,offset", [(None, 0.0), (5.0, 0.1)])
def test_loss_matches_reference(which, gamma, offset, request):
    model_dir = request.getfixturevalue("tiny_model_dir" if which == "sd1" else "tiny_sd2v_model_dir")
    c = load_components(ModelSection(pretrained_model_name_or_path=str(model_dir)), torch.float32)
    torch.manual_seed(3)
    batch = {
        "pixel_values": torch.rand(3, 3, 64, 64) * 2 - 1,
        "captions": ["a red circle", "shape", "a blue square on gray"],
        "loss_weights": torch.tensor([1.0, 0.5, 1.0]),
        "positions": torch.tensor([4, 0, 9]),
        "epoch": 2,
    }
    inputs = StepInputs(
        unet=c.unet, vae=c.vae, text_encoder=c.text_encoder, tokenizer=c.tokenizer,
        noise_scheduler=c.noise_scheduler, v_prediction=c.family.prediction_type == "v_prediction",
        train_text_encoder=False, weight_dtype=torch.float32, device=torch.device("cpu"),
        seed=11, noise_offset=offset, min_snr_gamma=gamma,
    )
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
    expected = _reference_loss(c, batch, 11, offset, gamma)
    assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-7), (ours.item(), expected.item())
    # and the per-sample keys matter: other positions give another loss
    with torch.no_grad():
        other = micro_batch_loss(inputs, {**batch, "positions": torch.tensor([5, 1, 10])})
    assert not torch.allclose(ours, other)
