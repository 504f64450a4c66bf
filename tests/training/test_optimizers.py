import pytest
import torch

from library.config.schema import OptimizerSection
from library.errors import ConfigError
from library.training.optimizers import build_optimizer


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
    with pytest.raises(ConfigError, match='no argument "momentum"'):
        build_optimizer(OptimizerSection(optimizer_args=["momentum=0.9"]), _groups())
