"""Every optimizer name constructs, honours group learning rates and steps like its own class."""

import bitsandbytes as bnb
import lion_pytorch
import prodigyopt
import pytest
import schedulefree
import torch
from transformers.optimization import Adafactor

from library.config import kohya
from library.config.schema import OptimizerSection
from library.training.optimizers import SPECS, build_optimizer, optimizer_class_path

# name -> (the class constructed directly, the keyword arguments the name implies)
REFERENCES = {
    "AdamW": (torch.optim.AdamW, {}),
    "AdamW8bit": (bnb.optim.AdamW8bit, {}),
    "PagedAdamW": (bnb.optim.PagedAdamW, {}),
    "PagedAdamW8bit": (bnb.optim.PagedAdamW8bit, {}),
    "PagedAdamW32bit": (bnb.optim.PagedAdamW32bit, {}),
    "Lion": (lion_pytorch.Lion, {}),
    "Lion8bit": (bnb.optim.Lion8bit, {}),
    "PagedLion8bit": (bnb.optim.PagedLion8bit, {}),
    "SGDNesterov": (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    "SGDNesterov8bit": (bnb.optim.SGD8bit, {"momentum": 0.9, "nesterov": True}),
    "Prodigy": (prodigyopt.Prodigy, {}),
    "Adafactor": (Adafactor, {"relative_step": False}),
    "AdamWScheduleFree": (schedulefree.AdamWScheduleFree, {}),
    "RAdamScheduleFree": (schedulefree.RAdamScheduleFree, {}),
    "SGDScheduleFree": (schedulefree.SGDScheduleFree, {}),
}


def _groups(lrs=(0.01, 0.002)):
    # 64 x 80 = 5120 elements: above bitsandbytes' 4096 threshold, so the 8-bit state is used
    gen = torch.Generator().manual_seed(0)
    a = torch.nn.Parameter(torch.randn(64, 80, generator=gen))
    b = torch.nn.Parameter(torch.randn(64, 80, generator=gen))
    return [
        {"params": [a], "lr": lrs[0], "name": "unet"},
        {"params": [b], "lr": lrs[1], "name": "te"},
    ]


def _steps(optimizer, n=8):  # RAdamScheduleFree moves only after a few steps
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_every_config_name_has_a_spec_and_a_reference():
    assert set(kohya.OPTIMIZERS.values()) == set(SPECS) == set(REFERENCES)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_name_matches_its_class_with_group_lrs(name):
    cls, implied = REFERENCES[name]
    args = ["relative_step=False"] if name == "Adafactor" else []
    lrs = (0.5, 0.5) if name == "Prodigy" else (0.01, 0.002)  # Prodigy: one rate for all groups
    section = OptimizerSection(optimizer_type=name.lower(), optimizer_args=args)
    ours = build_optimizer(section, _groups(lrs))
    assert type(ours) is cls
    ref = cls(_groups(lrs), lr=1e-4, **implied)
    if hasattr(ref, "train"):
        ref.train()  # schedule-free optimizers step only in train mode
    before = [g["params"][0].detach().clone() for g in ours.param_groups]
    _steps(ours)
    _steps(ref)
    for g, r, b in zip(ours.param_groups, ref.param_groups, before, strict=True):
        assert g["lr"] == r["lr"]  # the group's own lr, not learning_rate
        assert torch.equal(g["params"][0], r["params"][0]), name
        assert not torch.equal(g["params"][0], b), name
    assert [g["lr"] for g in ours.param_groups] == list(lrs)


def test_group_lrs_change_the_update():
    """The two groups move at their own rates: same grads, lr ratio 5 -> Lion steps ratio 5."""
    groups = _groups()
    start = [g["params"][0].detach().clone() for g in groups]
    opt = build_optimizer(OptimizerSection(optimizer_type="Lion"), groups)
    for g in opt.param_groups:
        g["params"][0].grad = torch.ones(64, 80)
    opt.step()
    moves = [
        (g["params"][0] - s).abs().max().item()
        for g, s in zip(opt.param_groups, start, strict=True)
    ]
    assert moves[0] == pytest.approx(0.01, rel=1e-4) and moves[1] == pytest.approx(0.002, rel=1e-4)


def test_sgd_nesterov_takes_momentum_from_args():
    section = OptimizerSection(optimizer_type="SGDNesterov", optimizer_args=["momentum=0.5"])
    opt = build_optimizer(section, _groups())
    assert opt.param_groups[0]["momentum"] == 0.5 and opt.param_groups[0]["nesterov"] is True


def test_any_torch_optimizer_by_class_path():
    section = OptimizerSection(optimizer_type="torch.optim.RMSprop", optimizer_args=["alpha=0.9"])
    ours = build_optimizer(section, _groups())
    ref = torch.optim.RMSprop(_groups(), lr=1e-4, alpha=0.9)
    _steps(ours)
    _steps(ref)
    assert type(ours) is torch.optim.RMSprop
    for g, r in zip(ours.param_groups, ref.param_groups, strict=True):
        assert torch.equal(g["params"][0], r["params"][0])


@pytest.mark.parametrize(
    "name,path",
    [
        ("Lion", "lion_pytorch.lion_pytorch.Lion"),
        ("SGDNesterov", "torch.optim.sgd.SGD"),
        ("AdamW8bit", "bitsandbytes.optim.adamw.AdamW8bit"),
    ],
)
def test_class_path_for_metadata(name, path):
    assert optimizer_class_path(name) == path
