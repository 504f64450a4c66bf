"""The learning rate of each optimizer step does not depend on processes or accumulation.

Four runs of the same 4-step warmup + cosine schedule: 2 processes x accumulation 4, 2 x 1,
1 x 2 and 1 x 1. Both the rates the optimizer really used (seen by a global optimizer hook on
every rank) and the rates logged to TensorBoard must follow the hand-written schedule.
"""

import math

import pytest

from tests.distributed.runs import scalars
from tests.distributed.suite import SCHEDULE_KEYS

LAUNCHES = ["sync", "acc1"]
RUNS = {"sync": 2, "acc1": 2, "single_acc2": 1, "single_acc1": 1}  # name -> processes
BASES = {"unet": SCHEDULE_KEYS["learning_rate"], "text_encoder": SCHEDULE_KEYS["text_encoder_lr"]}


def cosine_with_warmup(step: int, warmup: int, total: int) -> float:
    """The factor on the base rate for 0-based optimizer step ``step``, written out by hand."""
    if step < warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def expected(step: int) -> list[float]:
    factor = cosine_with_warmup(
        step, SCHEDULE_KEYS["lr_warmup_steps"], SCHEDULE_KEYS["max_train_steps"]
    )
    return [BASES["unet"] * factor, BASES["text_encoder"] * factor]


@pytest.mark.parametrize("name", list(RUNS))
def test_rates_used_by_the_optimizer_follow_the_schedule(runs, name):
    run = runs.schedule(name)
    steps = SCHEDULE_KEYS["max_train_steps"]
    for rank in range(RUNS[name]):
        used = run.rank(rank)["optimizer_lrs"]
        assert len(used) == steps, f"rank {rank} stepped its optimizer {len(used)} times"
        for step, rates in enumerate(used):
            assert rates == pytest.approx(expected(step), rel=1e-9, abs=1e-15), f"step {step + 1}"


def test_logged_rates_are_identical_across_layouts(runs):
    logged = {}
    for name in RUNS:
        logs = runs.schedule(name).out / "logs"
        logged[name] = {tag: scalars(logs, f"lr/{tag}") for tag in BASES}
    steps = SCHEDULE_KEYS["max_train_steps"]
    for name, tags in logged.items():
        for i, tag in enumerate(BASES):
            assert [s for s, _ in tags[tag]] == list(range(1, steps + 1)), name
            # logged after the schedule advanced: the rate of the next step (as kohya logs it)
            values = [v for _, v in tags[tag]]
            assert values == pytest.approx([expected(s)[i] for s in range(1, steps + 1)], rel=1e-6)
    first = logged["sync"]
    assert all(tags == first for tags in logged.values())
