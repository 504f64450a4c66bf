"""kohya's further schedules (cosine_with_min_lr, warmup_stable_decay, inverse_sqrt,
piecewise_constant) and lr_scheduler_args, each rate at every optimizer step against a formula
written here from the definitions sd-scripts uses (transformers' and diffusers' schedules, with
sd-scripts' arguments: num_cycles / 2 waves, min_lr_ratio 0 for warmup_stable_decay)."""

from __future__ import annotations

import math

import pytest
import torch

from library.config.schema import OptimizerSection
from library.errors import ConfigError
from library.training.schedulers import build_scheduler, decay_steps, restore_schedule


def _rates(section: OptimizerSection, total: int, group_lrs=None) -> list[list[float]]:
    """The learning rate of each parameter group at optimizer steps 0 .. total-1."""
    lrs = group_lrs or [section.learning_rate]
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    optimizer = torch.optim.SGD(groups, lr=section.learning_rate)
    schedule = build_scheduler(section, optimizer, total)
    out = []
    for _ in range(total):
        out.append(list(schedule.get_last_lr()))
        optimizer.step()
        schedule.step()
    return out


def _first(rates: list[list[float]]) -> list[float]:
    return [r[0] for r in rates]


def _cosine_min(step, total, warmup, cycles, ratio):
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    wave = 0.5 * (1 + math.cos(math.pi * (cycles / 2) * 2 * progress))
    return max(0.0, wave * (1 - ratio) + ratio)


@pytest.mark.parametrize(
    ("total", "warmup", "cycles", "ratio"), [(20, 0, 1, 0.1), (23, 5, 1, 0.25), (30, 4, 3, 0.0)]
)
def test_cosine_with_min_lr(total, warmup, cycles, ratio):
    section = OptimizerSection(
        learning_rate=2.0,
        lr_scheduler="cosine_with_min_lr",
        lr_warmup_steps=warmup,
        lr_scheduler_num_cycles=cycles,
        lr_scheduler_min_lr_ratio=ratio,
    )
    expected = [2.0 * _cosine_min(s, total, warmup, cycles, ratio) for s in range(total)]
    assert _first(_rates(section, total)) == pytest.approx(expected)


def test_cosine_with_min_lr_floor_is_per_group_and_min_lr_is_a_rate():
    section = OptimizerSection(
        learning_rate=1.0, lr_scheduler="cosine_with_min_lr", lr_scheduler_min_lr_ratio=0.2
    )
    rates = _rates(section, 10, group_lrs=[1.0, 0.5])
    for step, (unet, text) in enumerate(rates):
        assert unet == pytest.approx(_cosine_min(step, 10, 0, 1, 0.2))
        assert text == pytest.approx(0.5 * _cosine_min(step, 10, 0, 1, 0.2))
    # min_lr = 0.3 with learning_rate 2.0 is the ratio 0.15 (transformers: min_lr / lr)
    by_rate = OptimizerSection(
        learning_rate=2.0, lr_scheduler="cosine_with_min_lr", lr_scheduler_args=["min_lr=0.3"]
    )
    expected = [2.0 * _cosine_min(s, 12, 0, 1, 0.15) for s in range(12)]
    assert _first(_rates(by_rate, 12)) == pytest.approx(expected)


def _wsd(step, warmup, stable, decay, ratio, cycles, warmup_type, decay_type):
    shapes = {
        "linear": lambda p: p,
        "cosine": lambda p: 0.5 * (1 - math.cos(math.pi * p)),
        "1-sqrt": lambda p: 1 - math.sqrt(1 - p),
    }
    if step < warmup:
        return max(0.0, shapes[warmup_type](step / max(1, warmup)) * (1 - ratio) + ratio)
    if step < warmup + stable:
        return 1.0
    p = (step - warmup - stable) / max(1, decay)
    down = {
        "linear": 1 - p,
        "cosine": 0.5 * (1 + math.cos(math.pi * (cycles / 2) * 2 * p)),
        "1-sqrt": 1 - math.sqrt(p),
    }[decay_type]
    return max(0.0, down * (1 - ratio) + ratio)


@pytest.mark.parametrize(
    ("total", "warmup", "decay", "ratio", "cycles", "args"),
    [
        (30, 5, 10, None, 1, []),
        (30, 0.1, 0.4, 0.1, 1, ["warmup_type='cosine'", "decay_type='linear'"]),
        (25, 4, 12, 0.05, 2, ['decay_type="1-sqrt"', "warmup_type=1-sqrt"]),
        (16, 3, 0, None, 1, []),  # no decay: the full rate to the end
    ],
)
def test_warmup_stable_decay(total, warmup, decay, ratio, cycles, args):
    section = OptimizerSection(
        learning_rate=1.5,
        lr_scheduler="warmup_stable_decay",
        lr_warmup_steps=warmup,
        lr_decay_steps=decay,
        lr_scheduler_min_lr_ratio=ratio,
        lr_scheduler_num_cycles=cycles,
        lr_scheduler_args=args,
    )
    w = int(warmup * total) if isinstance(warmup, float) else warmup
    d = int(decay * total) if isinstance(decay, float) else decay
    given = dict(a.replace('"', "").replace("'", "").split("=") for a in args)
    shape = (given.get("warmup_type", "linear"), given.get("decay_type", "cosine"))
    expected = [
        1.5 * _wsd(s, w, total - w - d, d, ratio or 0.0, cycles, *shape) for s in range(total)
    ]
    assert _first(_rates(section, total)) == pytest.approx(expected)


def test_warmup_and_decay_longer_than_the_run_are_refused():
    section = OptimizerSection(
        lr_scheduler="warmup_stable_decay", lr_warmup_steps=6, lr_decay_steps=5
    )
    with pytest.raises(ConfigError, match="together are longer than the run"):
        decay_steps(section, 10)


@pytest.mark.parametrize(("warmup", "timescale"), [(0, None), (4, None), (4, 10), (0, 3)])
def test_inverse_sqrt(warmup, timescale):
    section = OptimizerSection(
        learning_rate=1.0,
        lr_scheduler="inverse_sqrt",
        lr_warmup_steps=warmup,
        lr_scheduler_timescale=timescale,
    )
    scale = timescale or warmup or 10_000

    def rate(step):
        if step < warmup:
            return step / max(1, warmup)
        return math.sqrt(scale / (step + scale - warmup))

    assert _first(_rates(section, 25)) == pytest.approx([rate(s) for s in range(25)])


@pytest.mark.parametrize("rules", ["1:5,0.5:9,0.1", "'1:5,0.5:9,0.1'", '"0.2:3,1:5,0.5:9,0.1"'])
def test_piecewise_constant(rules):
    section = OptimizerSection(
        learning_rate=3.0, lr_scheduler="piecewise_constant", lr_scheduler_args=[f"step_rules={rules}"]
    )
    pairs = [p.split(":") for p in rules.strip("'\"").split(",")[:-1]]
    last = float(rules.strip("'\"").split(",")[-1])

    def factor(step):
        for until, value in sorted((int(s), float(v)) for v, s in pairs):
            if step < until:
                return value
        return last

    assert _first(_rates(section, 14)) == pytest.approx([3.0 * factor(s) for s in range(14)])


def test_cosine_cycles_and_polynomial_end_from_lr_scheduler_args():
    cosine = OptimizerSection(
        learning_rate=1.0, lr_scheduler="cosine", lr_scheduler_args=["num_cycles=1.5"]
    )
    expected = [0.5 * (1 + math.cos(math.pi * 1.5 * 2 * s / 12)) for s in range(12)]
    assert _first(_rates(cosine, 12)) == pytest.approx([max(0.0, e) for e in expected])
    poly = OptimizerSection(
        learning_rate=1.0,
        lr_scheduler="polynomial",
        lr_scheduler_power=2.0,
        lr_warmup_steps=2,
        lr_scheduler_args={"lr_end": 0.1},
    )

    def rate(step):
        if step < 2:
            return step / 2
        remaining = 1 - (step - 2) / (12 - 2)
        return (1.0 - 0.1) * remaining**2 + 0.1

    assert _first(_rates(poly, 12)) == pytest.approx([rate(s) for s in range(12)])


@pytest.mark.parametrize(
    "settings",
    [
        dict(lr_scheduler="cosine_with_min_lr", lr_scheduler_min_lr_ratio=0.1, lr_warmup_steps=3),
        dict(lr_scheduler="warmup_stable_decay", lr_warmup_steps=2, lr_decay_steps=6),
        dict(lr_scheduler="inverse_sqrt", lr_warmup_steps=3),
        dict(lr_scheduler="piecewise_constant", lr_scheduler_args=["step_rules=1:4,0.5"]),
    ],
)
def test_a_resumed_schedule_continues_where_it_stopped(settings):
    section = OptimizerSection(learning_rate=1.0, **settings)
    whole = _first(_rates(section, 14))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    first = build_scheduler(section, optimizer, 14)
    for _ in range(6):
        optimizer.step()
        first.step()
    fresh = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    again = build_scheduler(section, fresh, 14)
    restore_schedule(again, first.state_dict())
    rest = []
    for _ in range(8):
        rest.append(again.get_last_lr()[0])
        fresh.step()
        again.step()
    assert rest == pytest.approx(whole[6:])
