"""Caches, augmentation and validation give the same run on 2 processes as on one.

2 processes x batch 1 build the latent cache in shares and exchange it, draw flips and caption
shuffles per sample, and score the held-out image every step; one process with accumulation 2
must write the same weights and log the same validation losses.
"""

import pytest

from tests.distributed.runs import scalars
from tests.integration.harness import assert_close_dicts

LAUNCHES = ["data-2x1x1"]


def test_two_processes_with_caches_and_validation_match_one(runs):
    ddp = runs.get("data-2x1x1").check()
    single = runs.get("data-1x2x1").check()
    assert_close_dicts(ddp.weights(), single.weights(), atol=1e-6, rtol=1e-6)
    ups = [v for k, v in ddp.weights().items() if k.endswith("lora_up.weight")]
    assert max(v.abs().max().item() for v in ups) > 1e-4  # the steps did move the weights
    two = scalars(ddp.out / "logs", "loss/validation")
    one = scalars(single.out / "logs", "loss/validation")
    assert [s for s, _ in two] == [1, 2] == [s for s, _ in one]
    assert [v for _, v in two] == pytest.approx([v for _, v in one], rel=1e-5)
    assert "latent cache: 7 entries" in ddp.log  # 3 training images x 2 sides + 1 held out
