"""build_optimizer: kohya arguments, Adafactor's relative step, schedule-free modes, errors."""

import math
import sys

import pytest
import torch
from pydantic import ValidationError
from transformers.optimization import Adafactor

from library.config.schema import OptimizerSection
from library.errors import ConfigError
from library.training.optimizers import (
    build_optimizer,
    effective_learning_rates,
    optimizer_eval_mode,
    optimizer_train_mode,
)
from library.training.schedulers import build_scheduler


def _groups():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(8)), torch.nn.Parameter(torch.randn(8))
    return [{"params": [a], "lr": 0.1, "name": "unet"}, {"params": [b], "lr": 0.01, "name": "te"}]


def test_adamw_with_kohya_args_matches_torch():
    section = OptimizerSection(optimizer_args=["weight_decay=0.05", "betas=0.8,0.95", "eps=1e-6"])
    opt = build_optimizer(section, _groups())
    ref = torch.optim.AdamW(_groups(), weight_decay=0.05, betas=(0.8, 0.95), eps=1e-6)
    for o in (opt, ref):
        for g in o.param_groups:
            g["params"][0].grad = torch.ones(8)
        o.step()
    for g, r in zip(opt.param_groups, ref.param_groups, strict=True):
        assert g["lr"] == r["lr"] and g["betas"] == (0.8, 0.95)
        assert torch.equal(g["params"][0], r["params"][0])


def test_optimizer_args_as_table():
    opt = build_optimizer(OptimizerSection(optimizer_args={"weight_decay": 0.3}), _groups())
    assert opt.param_groups[0]["weight_decay"] == 0.3


def test_adamw8bit_steps_on_cpu():
    groups = _groups()
    before = groups[0]["params"][0].detach().clone()
    opt = build_optimizer(OptimizerSection(optimizer_type="AdamW8bit"), groups)
    groups[0]["params"][0].grad = torch.ones(8)
    groups[1]["params"][0].grad = torch.ones(8)
    opt.step()
    assert not torch.equal(before, groups[0]["params"][0].detach())


def test_unknown_optimizer_argument_is_a_clear_error():
    with pytest.raises(ValidationError, match='AdamW has no argument "momentum"'):
        OptimizerSection(optimizer_args=["momentum=0.9"])  # checked when the config is built
    unchecked = OptimizerSection.model_construct(
        optimizer_type="AdamW", optimizer_args=["momentum=0.9"], learning_rate=1e-4
    )
    with pytest.raises(ConfigError, match='no argument "momentum"'):
        build_optimizer(unchecked, _groups())  # and again when it is built


def test_relative_step_adafactor_drops_lrs_and_reports_its_step_size():
    section = OptimizerSection(
        optimizer_type="Adafactor", lr_scheduler="adafactor", learning_rate=3e-3
    )
    groups = [{"params": g["params"], "name": g["name"], "lr": 3e-3} for g in _groups()]
    opt = build_optimizer(section, groups)
    sched = build_scheduler(section, opt, 100)
    assert sched.get_last_lr() == [
        3e-3,
        3e-3,
    ]  # before the first step: learning_rate, as kohya shows
    ref = Adafactor(
        [{"params": [p.detach().clone().requires_grad_()]} for g in groups for p in g["params"]]
    )
    for step in range(1, 4):
        for o in (opt, ref):
            for g in o.param_groups:
                g["params"][0].grad = torch.full((8,), 0.5)
            o.step()
        opt.zero_grad(set_to_none=True)  # the trainer steps the schedule after zero_grad
        sched.step()
        for g, r in zip(opt.param_groups, ref.param_groups, strict=True):
            assert torch.equal(g["params"][0], r["params"][0])
        # Adafactor's relative step: min(1e-2, 1/sqrt(step)) times the parameter RMS (>= 1e-3)
        expected = [
            min(1e-2, 1 / math.sqrt(step)) * max(1e-3, float(ref.state[g["params"][0]]["RMS"]))
            for g in ref.param_groups
        ]
        assert sched.get_last_lr() == pytest.approx(expected)


def test_adafactor_refuses_group_learning_rates():
    section = OptimizerSection(optimizer_type="Adafactor")
    with pytest.raises(ConfigError, match="unet_lr, text_encoder_lr and LoRA\\+ have no effect"):
        build_optimizer(section, _groups())  # the groups carry 0.1 and 0.01


def test_prodigy_refuses_different_group_rates():
    with pytest.raises(ConfigError, match="Prodigy needs one learning rate"):
        build_optimizer(OptimizerSection(optimizer_type="Prodigy"), _groups())


class _Wrapped:
    """Stands for accelerate's AcceleratedOptimizer: the real one sits in ``.optimizer``."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self):
        self.optimizer.step()


def test_schedule_free_train_and_eval_modes():
    groups = _groups()
    opt = build_optimizer(OptimizerSection(optimizer_type="AdamWScheduleFree"), groups)
    wrapped = _Wrapped(opt)
    for _ in range(3):
        for g in opt.param_groups:
            g["params"][0].grad = torch.randn(8)
        wrapped.step()  # would raise if build_optimizer had left it in eval mode
    y = [g["params"][0].detach().clone() for g in opt.param_groups]
    optimizer_eval_mode(wrapped)
    beta1 = opt.param_groups[0]["betas"][0]
    for g, yi in zip(opt.param_groups, y, strict=True):
        z = opt.state[g["params"][0]]["z"]
        # y = (1 - beta1) z + beta1 x  =>  x = (y - (1 - beta1) z) / beta1
        assert torch.allclose(g["params"][0], (yi - (1 - beta1) * z) / beta1, atol=1e-6)
    optimizer_eval_mode(wrapped)  # twice is harmless
    optimizer_train_mode(wrapped)
    for g, yi in zip(opt.param_groups, y, strict=True):
        assert torch.allclose(g["params"][0], yi, atol=1e-6)


def test_mode_switches_are_no_ops_for_other_optimizers():
    groups = _groups()
    opt = build_optimizer(OptimizerSection(), groups)
    before = [g["params"][0].detach().clone() for g in groups]
    optimizer_eval_mode(opt)
    optimizer_train_mode(_Wrapped(opt))
    assert all(torch.equal(g["params"][0], b) for g, b in zip(groups, before, strict=True))


def test_effective_learning_rates():
    prodigy = build_optimizer(
        OptimizerSection(optimizer_type="Prodigy"), [{"params": _groups()[0]["params"], "lr": 1.0}]
    )
    assert effective_learning_rates(prodigy) == [prodigy.param_groups[0]["d"]]
    assert effective_learning_rates(build_optimizer(OptimizerSection(), _groups())) == [0.1, 0.01]


def test_missing_package_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "lion_pytorch", None)  # makes its import fail
    with pytest.raises(ConfigError, match="needs lion-pytorch.*pip install lion-pytorch"):
        build_optimizer(OptimizerSection(optimizer_type="Lion"), _groups())
