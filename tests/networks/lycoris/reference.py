"""Shared cases for the LyCORIS tests: small base layers, our layer and LyCORIS' own module.

LyCORIS' modules (``lycoris-lora``) are the independent computation every test compares with.
Their ``state_dict()`` is what their files hold (the scalar folded in, ``alpha`` a buffer), so
parameters cross over through our ``load_file_tensors`` exactly as a saved file would.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from library.networks.lycoris.layer import LycorisLayer, layer_kind
from library.networks.lycoris.spec import LycorisSpec

BASES = {
    "linear": lambda: nn.Linear(24, 40),
    "conv1": lambda: nn.Conv2d(8, 12, 1),
    "conv3": lambda: nn.Conv2d(8, 12, 3, padding=1),
    "conv3s": lambda: nn.Conv2d(8, 12, 3, stride=2, padding=2, dilation=2),
}
INPUT_SHAPES = {
    "linear": (3, 5, 24),
    "conv1": (2, 8, 6, 6),
    "conv3": (2, 8, 6, 6),
    "conv3s": (2, 8, 7, 7),
}


@dataclass(frozen=True)
class Case:
    algo: str
    base: str
    dim: int = 4
    alpha: float = 2.0
    opts: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.opts.items())
        return f"{self.algo}-{self.base}-r{self.dim}-a{self.alpha}" + (f"-{extra}" if extra else "")


def _dora(algo: str, base: str, dim: int = 4, **opts) -> list[Case]:
    return [
        Case(algo, base, dim=dim, opts={"dora_wd": True, "wd_on_output": on_out, **opts})
        for on_out in (True, False)
    ]


CASES = [
    # LoCon (algo lora/locon)
    Case("lora", "linear"),
    Case("locon", "linear", opts={"rs_lora": True}),
    Case("locon", "linear", opts={"use_scalar": True}),
    Case("locon", "linear", alpha=0.0),
    Case("locon", "conv1"),
    Case("locon", "conv3", dim=3, alpha=1.5),
    Case("locon", "conv3", opts={"use_tucker": True}),
    Case("locon", "conv3s"),
    Case("locon", "conv3s", opts={"use_tucker": True, "use_scalar": True}),
    *_dora("locon", "linear"),
    *_dora("locon", "conv1"),
    *_dora("locon", "conv3"),
    *_dora("locon", "conv3", use_tucker=True),
    # LoHa
    Case("loha", "linear"),
    Case("loha", "linear", opts={"rs_lora": True}),
    Case("loha", "linear", opts={"use_scalar": True}),
    Case("loha", "conv1"),
    Case("loha", "conv3", dim=3),
    Case("loha", "conv3", opts={"use_tucker": True}),
    Case("loha", "conv3s", opts={"use_tucker": True}),
    *_dora("loha", "linear"),
    *_dora("loha", "conv3"),
    *_dora("loha", "conv3", use_tucker=True),
    # LoKr: Linear 24->40 splits 40 = 5x8 and 24 = 4x6 (factor -1)
    Case("lokr", "linear", dim=2, opts={"decompose_both": True}),  # w1_a/b and w2_a/b
    Case("lokr", "linear", dim=2),  # w1 full, w2_a/b
    Case("lokr", "linear", dim=3, opts={"decompose_both": True}),  # w1 full (3 >= 5/2)
    Case("lokr", "linear", dim=4),  # both full: alpha forced, scale 1
    Case("lokr", "linear", dim=2, opts={"full_matrix": True, "decompose_both": True}),
    Case("lokr", "linear", dim=2, opts={"factor": 4}),
    Case("lokr", "linear", dim=2, opts={"factor": 8, "decompose_both": True}),
    Case("lokr", "linear", dim=2, opts={"factor": 3}),
    Case("lokr", "linear", dim=2, opts={"unbalanced_factorization": True}),
    Case("lokr", "linear", dim=2, opts={"use_scalar": True, "decompose_both": True}),
    Case("lokr", "linear", dim=4, opts={"use_scalar": True}),
    Case("lokr", "linear", dim=2, opts={"rs_lora": True}),
    Case("lokr", "conv1", dim=2, opts={"factor": 2}),
    Case("lokr", "conv1", dim=4),
    Case("lokr", "conv3", dim=1, opts={"decompose_both": True}),
    Case("lokr", "conv3", dim=2),  # 12 = 3x4, 8 = 2x4: w2 full with the kernel
    Case("lokr", "conv3", dim=2, opts={"factor": 2}),
    Case("lokr", "conv3", dim=2, opts={"factor": 2, "use_tucker": True}),
    Case("lokr", "conv3s", dim=2, opts={"factor": 2, "use_tucker": True, "use_scalar": True}),
    *_dora("lokr", "linear", dim=2, decompose_both=True),
    *_dora("lokr", "linear", dim=4),
    *_dora("lokr", "conv3", factor=2),
    *_dora("lokr", "conv3", factor=2, use_tucker=True),
]
CASE_PARAMS = [pytest.param(c, id=c.id) for c in CASES]


def make_base(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    base = BASES[name]()
    with torch.no_grad():
        base.weight.mul_(3.0)  # not tiny next to the adapter changes
    return base


def make_input(case: Case, seed: int = 1, batch: int | None = None) -> torch.Tensor:
    shape = list(INPUT_SHAPES[case.base])
    if batch is not None:
        shape[0] = batch
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def make_spec(case: Case) -> LycorisSpec:
    return LycorisSpec(
        algo=case.algo,
        dim=case.dim,
        alpha=case.alpha,
        conv_dim=case.dim,
        conv_alpha=case.alpha,
        **case.opts,
    )


def make_ours(case: Case, base: nn.Module, seed: int = 5) -> LycorisLayer:
    return LycorisLayer(copy.deepcopy(base), make_spec(case), layer_kind(base), generator=seed)


def make_reference(case: Case, base: nn.Module) -> nn.Module:
    """LyCORIS' own module for ``case`` on a copy of ``base`` (weight-rebuild mode)."""
    from lycoris.modules.locon import LoConModule
    from lycoris.modules.loha import LohaModule
    from lycoris.modules.lokr import LokrModule

    cls = {"lora": LoConModule, "locon": LoConModule, "loha": LohaModule, "lokr": LokrModule}
    opts = dict(case.opts)
    module = cls[case.algo](
        "ref",
        copy.deepcopy(base),
        multiplier=1.0,
        lora_dim=case.dim,
        alpha=case.alpha,
        use_tucker=opts.pop("use_tucker", False),
        use_scalar=opts.pop("use_scalar", False),
        weight_decompose=opts.pop("dora_wd", False),
        wd_on_out=opts.pop("wd_on_output", True),
        rs_lora=opts.pop("rs_lora", False),
        bypass_mode=False,
        **opts,
    )
    return module


@torch.no_grad()
def randomize_reference(module: nn.Module, seed: int = 3) -> None:
    """Non-zero random values in every trained tensor of a LyCORIS module (scalar 0.7)."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in module.named_parameters():
        if name == "scalar":
            param.fill_(0.7)
        elif name == "dora_scale":
            noise = torch.rand(param.shape, generator=gen) * 0.4 + 0.8
            param.mul_(noise)
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)


def reference_pair(case: Case, base_seed: int = 0):
    """(base, our layer, LyCORIS module) with the same random adapter in both."""
    base = make_base(case.base, base_seed)
    ref = make_reference(case, base)
    randomize_reference(ref)
    ours = make_ours(case, base)
    ours.load_file_tensors(ref.state_dict(), "reference")
    return base, ours, ref


def reload_reference(ref: nn.Module) -> None:
    """Round-trip LyCORIS' module through its own state dict (folds the scalar, resets it to 1)."""
    ref.load_state_dict(ref.state_dict())


def reference_param_names(ref: nn.Module) -> dict[str, nn.Parameter]:
    """LyCORIS parameter name -> parameter, named like our attributes (no ``.weight``)."""
    return {name.removesuffix(".weight"): p for name, p in ref.named_parameters()}


def our_param_names(layer: LycorisLayer) -> dict[str, nn.Parameter]:
    """Our adapter parameter name -> parameter (the base layer's are left out)."""
    return {n: p for n, p in layer.named_parameters() if not n.startswith("base_layer.")}


@torch.no_grad()
def reference_delta(ref: nn.Module) -> torch.Tensor:
    """LyCORIS' weight change as its forward uses it (scale and scalar, no multiplier).

    LoCon's ``get_diff_weight`` is that; LoHa's and LoKr's ``get_diff_weight`` in lycoris-lora
    4.1.3 multiply the scale in twice (``get_weight`` already holds it), so for them the
    forward's own ``get_weight(shape) * scalar`` is the reference.
    """
    if ref.name == "locon":
        return ref.get_diff_weight(multiplier=1.0)[0].float()
    return (ref.get_weight(ref.shape) * ref.scalar).float()


@torch.no_grad()
def reference_merged(ref: nn.Module, multiplier: float) -> torch.Tensor:
    """LyCORIS' merged weight at ``multiplier`` (its functional DoRA when the module has one)."""
    from lycoris.functional.general import weight_decompose

    if ref.name == "locon":
        return ref.get_merged_weight(multiplier=multiplier)[0].float()
    weight = ref.org_weight.detach().float()
    delta = reference_delta(ref)
    if ref.wd:
        return weight_decompose(weight + delta, ref.dora_scale, multiplier, ref.wd_on_out)
    return weight + multiplier * delta


@torch.no_grad()
def functional_delta(sd: dict, weight_shape) -> torch.Tensor:
    """A file's weight change through LyCORIS' functional API (scale = alpha / rank)."""
    from lycoris.functional import locon, loha, lokr

    alpha = float(sd["alpha"])
    if "lora_up.weight" in sd:
        rank = sd["lora_down.weight"].shape[0]
        return locon.diff_weight(
            sd["lora_down.weight"],
            sd["lora_up.weight"],
            sd.get("lora_mid.weight"),
            gamma=alpha / rank,
        ).reshape(weight_shape)
    if "hada_w1_a" in sd:
        rank = sd["hada_w1_b"].shape[0]
        return loha.diff_weight(
            sd["hada_w1_b"],
            sd["hada_w1_a"],
            sd["hada_w2_b"],
            sd["hada_w2_a"],
            sd.get("hada_t1"),
            sd.get("hada_t2"),
            gamma=alpha / rank,
        ).reshape(weight_shape)
    rank_key = "lokr_w1_b" if "lokr_w1_b" in sd else "lokr_w2_b" if "lokr_w2_b" in sd else None
    scale = alpha / sd[rank_key].shape[0] if rank_key else 1.0
    parts = [
        sd.get(k)
        for k in (
            "lokr_w1",
            "lokr_w1_a",
            "lokr_w1_b",
            "lokr_w2",
            "lokr_w2_a",
            "lokr_w2_b",
            "lokr_t2",
        )
    ]
    return lokr.kron_weight(*parts, scale=scale).reshape(weight_shape)
