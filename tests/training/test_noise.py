import torch

from library.training.noise import draw, sample_seed


def test_sample_seed_is_stable_and_distinct():
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3)
    keys = {(s, e, p) for s in range(3) for e in range(3) for p in range(20)}
    assert len({sample_seed(*k) for k in keys}) == len(keys)
    assert 0 <= sample_seed(42, 0, 0) < 2**63


def test_draws_do_not_depend_on_batching():
    together = draw(7, 1, [0, 1, 2, 3], (4, 8, 8), 1000, torch.device("cpu"))
    singles = [draw(7, 1, [p], (4, 8, 8), 1000, torch.device("cpu")) for p in range(4)]
    for field in ("latent_eps", "noise", "timesteps", "offset"):
        joined = torch.cat([getattr(s, field) for s in singles])
        assert torch.equal(getattr(together, field), joined), field


def test_draws_differ_between_epochs_and_positions():
    a = draw(7, 0, [0], (4, 8, 8), 1000, torch.device("cpu"))
    b = draw(7, 1, [0], (4, 8, 8), 1000, torch.device("cpu"))
    c = draw(7, 0, [1], (4, 8, 8), 1000, torch.device("cpu"))
    assert not torch.equal(a.noise, b.noise)
    assert not torch.equal(a.noise, c.noise)
    assert not torch.equal(a.noise, a.latent_eps)
    assert a.offset.shape == (1, 4, 1, 1)
