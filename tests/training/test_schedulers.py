import math

import pytest
import torch

from library.config.schema import OptimizerSection
from library.errors import ConfigError
from library.training.schedulers import build_scheduler, warmup_steps


def _lrs(section, total):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=section.learning_rate)
    sched = build_scheduler(section, opt, total)
    out = []
    for _ in range(total):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_warmup_count_and_ratio():
    assert warmup_steps(OptimizerSection(lr_warmup_steps=7), 100) == 7
    assert warmup_steps(OptimizerSection(lr_warmup_steps=0.1), 100) == 10
    assert warmup_steps(OptimizerSection(lr_warmup_steps=0.25), 10) == 2
    with pytest.raises(ConfigError, match="lr_warmup_steps"):
        warmup_steps(OptimizerSection(lr_warmup_steps=200), 100)


def test_linear_schedule_with_warmup_matches_formula():
    section = OptimizerSection(learning_rate=1.0, lr_scheduler="linear", lr_warmup_steps=0.2)
    total, warm = 10, 2
    expected = [s / warm if s < warm else (total - s) / (total - warm) for s in range(total)]
    assert _lrs(section, total) == pytest.approx(expected)


def test_cosine_schedule_matches_formula():
    section = OptimizerSection(learning_rate=2.0, lr_scheduler="cosine")
    total = 8
    expected = [2.0 * 0.5 * (1 + math.cos(math.pi * s / total)) for s in range(total)]
    assert _lrs(section, total) == pytest.approx(expected)


@pytest.mark.parametrize(
    "name", ["constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"]
)
def test_every_schedule_warms_up_and_stays_bounded(name):
    lrs = _lrs(OptimizerSection(learning_rate=1.0, lr_scheduler=name, lr_warmup_steps=3), 12)
    assert lrs[:3] == pytest.approx([0, 1 / 3, 2 / 3])
    assert all(0 <= lr <= 1.0 + 1e-9 for lr in lrs)


def test_constant_with_warmup_is_refused():
    with pytest.raises(ConfigError, match="constant_with_warmup"):
        _lrs(OptimizerSection(lr_scheduler="constant", lr_warmup_steps=5), 10)
