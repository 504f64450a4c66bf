"""Validation loss against a plain-PyTorch computation at fixed timesteps and keyed noise."""

import pytest
import torch
from cpu_inputs import cpu_inputs, plain_text_states

from library.config.schema import ModelSection
from library.data.schedule import stable_seed
from library.errors import ConfigError
from library.models.loader import load_components
from library.training.loss import LossOptions
from library.training.validation import (
    VALIDATION_TIMESTEPS_DEFAULT,
    batch_validation_loss,
    validation_loss,
    validation_timesteps,
)

SEED = 21
TIMESTEPS = (100, 700)


def _alpha_bar(t: int) -> torch.Tensor:
    """SD's scaled-linear schedule (beta 0.00085 .. 0.012 over 1000 steps) at t."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, 0)[t].float()


def _load(model_dir):
    return load_components(
        ModelSection(pretrained_model_name_or_path=str(model_dir)), torch.float32
    )



def _batch(n=2, seed=4):
    gen = torch.Generator().manual_seed(seed)
    captions = ["a red circle", "shape", "a blue square on gray"][:n]
    return {
        "pixel_values": torch.rand(n, 3, 64, 64, generator=gen) * 2 - 1,
        "captions": captions,
        "loss_weights": torch.tensor([0.5, 2.0, 1.0][:n]),  # must not matter
        "positions": torch.arange(n),
        "epoch": 0,
        "validation_keys": ["0/a.png", "0/b.png", "1/c.png"][:n],
    }


def _inputs(c, unet=None, **options):
    return cpu_inputs(c, 999, unet, **options)  # the training seed; validation uses its own


def _reference(c, batch, timesteps, seed, v_target, mask=None, huber_c=None):
    """The textbook sum: x_t = sqrt(a) x0 + sqrt(1-a) eps, eps from the image's own generator."""
    with torch.no_grad():
        x0 = c.vae.encode(batch["pixel_values"]).latent_dist.mean * c.vae.config.scaling_factor
        hidden = plain_text_states(c, batch["captions"])
        total = 0.0
        for t in timesteps:
            eps = torch.stack(
                [
                    torch.randn(
                        x0.shape[1:],
                        generator=torch.Generator().manual_seed(
                            stable_seed(seed, "validation", k, t)
                        ),
                    )
                    for k in batch["validation_keys"]
                ]
            )
            a = _alpha_bar(t)
            xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
            pred = c.denoiser(xt, torch.full((len(eps),), t), hidden).sample
            target = a.sqrt() * eps - (1 - a).sqrt() * x0 if v_target else eps
            if huber_c is None:
                elements = (pred - target) ** 2
            else:
                elements = 2 * huber_c * (torch.sqrt((pred - target) ** 2 + huber_c**2) - huber_c)
            if mask is not None:
                elements = elements * mask
            total += elements.mean(dim=(1, 2, 3)).sum().item()
        return total


@pytest.mark.parametrize("which", ["sd1", "sd2v"])
def test_batch_loss_matches_reference(which, sd1, request):
    c = sd1 if which == "sd1" else _load(request.getfixturevalue("tiny_sd2v_model_dir"))
    batch = _batch()
    total, count = batch_validation_loss(_inputs(c), batch, TIMESTEPS, SEED)
    assert count == 2 * len(TIMESTEPS)
    assert total.dtype == torch.float32 and total.dim() == 0
    v_pred = which == "sd2v"
    expected = _reference(c, batch, TIMESTEPS, SEED, v_target=v_pred)
    assert total.item() == pytest.approx(expected, rel=1e-5)
    # the target matters: the other one gives another loss
    other = _reference(c, batch, TIMESTEPS, SEED, v_target=not v_pred)
    assert total.item() != pytest.approx(other, rel=1e-3)


def test_alpha_mask_and_huber_match_reference(sd1):
    c = sd1
    batch = _batch()
    masks = torch.zeros(2, 1, 64, 64)
    masks[..., :32] = 1.0  # the left half of each image counts
    batch["alpha_masks"] = masks
    s = _inputs(c, loss=LossOptions(loss_type="huber", huber_schedule="constant", huber_c=0.3))
    total, _ = batch_validation_loss(s, batch, TIMESTEPS, SEED)
    latent_mask = torch.zeros(2, 1, 8, 8)
    latent_mask[..., :4] = 1.0
    expected = _reference(c, batch, TIMESTEPS, SEED, False, mask=latent_mask, huber_c=0.3)
    assert total.item() == pytest.approx(expected, rel=1e-5)


def test_total_does_not_depend_on_batch_composition(sd1):
    c = sd1
    s = _inputs(c)
    both = _batch(3)
    together, n = batch_validation_loss(s, both, TIMESTEPS, SEED)
    parts = [
        batch_validation_loss(s, _slice(both, i, j), TIMESTEPS, SEED) for i, j in ((0, 1), (1, 3))
    ]
    assert n == sum(p[1] for p in parts) == 3 * len(TIMESTEPS)
    assert together.item() == pytest.approx(sum(p[0].item() for p in parts), rel=1e-5)
    # the noise follows the image's key: swapping keys between images changes the loss
    swapped = {**both, "validation_keys": list(reversed(both["validation_keys"]))}
    assert batch_validation_loss(s, swapped, TIMESTEPS, SEED)[0].item() != pytest.approx(
        together.item(), rel=1e-4
    )


def test_unreadable_samples_are_left_out(sd1):
    s = _inputs(sd1)
    both = _batch(3)
    marked = {**both, "readable": torch.tensor([True, False, True])}
    total, n = batch_validation_loss(s, marked, TIMESTEPS, SEED)
    kept = [batch_validation_loss(s, _slice(both, i, i + 1), TIMESTEPS, SEED) for i in (0, 2)]
    assert n == 2 * len(TIMESTEPS)
    assert total.item() == pytest.approx(sum(p[0].item() for p in kept), rel=1e-5)


def _slice(batch, i, j):
    return {k: v if k == "epoch" else v[i:j] for k, v in batch.items()}


def test_deterministic_across_calls_and_seeded(sd1):
    c = sd1
    s = _inputs(c)
    first = batch_validation_loss(s, _batch(), TIMESTEPS, SEED)[0]
    assert torch.equal(first, batch_validation_loss(s, _batch(), TIMESTEPS, SEED)[0])
    other = batch_validation_loss(s, _batch(), TIMESTEPS, SEED + 1)[0]
    assert other.item() != pytest.approx(first.item(), rel=1e-4)


class _Wrapped(torch.nn.Module):
    """Stands in for DistributedDataParallel: holds the model as .module; its forward must not run."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        raise AssertionError("the wrapper's forward ran")


def test_wrapped_unet_is_unwrapped(sd1):
    c = sd1
    batch = _batch()
    plain = batch_validation_loss(_inputs(c), batch, TIMESTEPS, SEED)[0]
    wrapped = batch_validation_loss(_inputs(c, unet=_Wrapped(c.denoiser)), batch, TIMESTEPS, SEED)[0]
    assert torch.equal(plain, wrapped)


def test_validation_loss_is_the_mean_over_batches_and_ranks(sd1):
    c = sd1
    s = _inputs(c)
    full = _batch(3)
    mine, theirs = _slice(full, 0, 2), _slice(full, 2, 3)
    t_all, n_all = batch_validation_loss(s, full, TIMESTEPS, SEED)
    mean = t_all.item() / n_all
    assert validation_loss(s, [mine, theirs], TIMESTEPS, SEED) == pytest.approx(mean, rel=1e-5)
    # another rank holding `theirs`: reduce adds its [total, count]
    t_other, n_other = batch_validation_loss(s, theirs, TIMESTEPS, SEED)
    other_sums = torch.stack([t_other, torch.tensor(float(n_other))])
    reduce = lambda x: x + other_sums  # noqa: E731
    assert validation_loss(s, [mine], TIMESTEPS, SEED, reduce) == pytest.approx(mean, rel=1e-5)
    # a rank without batches still gets the global mean
    assert validation_loss(
        s, [], TIMESTEPS, SEED, lambda x: x + torch.stack([t_all, torch.tensor(float(n_all))])
    ) == pytest.approx(mean, rel=1e-5)
    with pytest.raises(ValueError, match="no validation samples"):
        validation_loss(s, [], TIMESTEPS, SEED)


def test_bad_inputs(sd1):
    c = sd1
    s = _inputs(c)
    with pytest.raises(ConfigError, match="1000 is outside 0..999"):
        batch_validation_loss(s, _batch(), (500, 1000), SEED)
    with pytest.raises(ConfigError, match="at least one timestep"):
        batch_validation_loss(s, _batch(), (), SEED)
    missing = {k: v for k, v in _batch().items() if k != "validation_keys"}
    with pytest.raises(ValueError, match="validation_keys"):
        batch_validation_loss(s, missing, TIMESTEPS, SEED)


def test_validation_timesteps():
    assert (
        tuple(validation_timesteps(1000))
        == VALIDATION_TIMESTEPS_DEFAULT
        == (100, 300, 500, 700, 900)
    )
    assert validation_timesteps(1000, 1) == [500]
    assert validation_timesteps(1000, 4) == [125, 375, 625, 875]
    assert validation_timesteps(10, 10) == list(range(10))
    for bad in (0, 1001):
        with pytest.raises(ValueError, match="count"):
            validation_timesteps(1000, bad)
