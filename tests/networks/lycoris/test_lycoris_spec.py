"""LycorisSpec: LyCORIS' network_args defaults, fallbacks and refusals; factorization."""

from __future__ import annotations

import dataclasses

import pytest

from library.networks.lycoris.factorize import factorization
from library.networks.lycoris.spec import ALGOS, LycorisSpec, module_algo, normalize_algo


def test_defaults_follow_lycoris_create_network() -> None:
    spec = LycorisSpec()
    assert (spec.algo, spec.dim, spec.alpha, spec.conv_dim, spec.conv_alpha) == (
        "lora", 4, 1.0, 4, 1.0,
    )  # fmt: skip
    assert spec.factor == -1 and spec.wd_on_output is True
    assert not any(
        (spec.decompose_both, spec.use_tucker, spec.use_scalar, spec.full_matrix,
         spec.unbalanced_factorization, spec.dora_wd, spec.rs_lora)
    )  # fmt: skip
    args = LycorisSpec.from_network_args(None, None)
    assert args == spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.dim = 8  # type: ignore[misc]


def test_conv_dim_and_conv_alpha_fall_back_to_the_linear_ones() -> None:
    spec = LycorisSpec.from_network_args(16, 8.0, algo="LoKr", factor=8)
    assert (spec.conv_dim, spec.conv_alpha, spec.algo, spec.factor) == (16, 8.0, "lokr", 8)
    assert LycorisSpec(dim=16, alpha=8, conv_dim=0, conv_alpha=0).conv_dim == 16
    assert LycorisSpec(dim=16, alpha=8, conv_dim=0, conv_alpha=0).conv_alpha == 8.0
    spec = LycorisSpec(dim=16, alpha=8, conv_dim=4, conv_alpha=2)
    assert (spec.rank_for("linear"), spec.alpha_for("linear")) == (16, 8.0)
    assert (spec.rank_for("conv"), spec.alpha_for("conv")) == (4, 2.0)
    assert spec.rank_key("conv") == "conv_dim"


def test_algo_names() -> None:
    assert ALGOS == ("lora", "locon", "loha", "lokr")
    assert normalize_algo(" LoCon ") == "locon"
    assert [module_algo(a) for a in ALGOS] == ["locon", "locon", "loha", "lokr"]
    for name in ("ia3", "dylora", "glora", "full", "diag-oft", "boft"):
        with pytest.raises(ValueError, match=f'"algo={name}".*lora, locon, loha, lokr'):
            LycorisSpec(algo=name)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algo": "lokr", "factor": 0}, 'network_args "factor=0": factor must be -1'),
        ({"algo": "lokr", "factor": -3}, '"factor=-3"'),
        ({"dim": 0}, "network_dim=0"),
        ({"dim": 2.5}, "network_dim=2.5"),
        ({"alpha": -1.0}, "network_alpha=-1.0"),
        ({"alpha": float("inf")}, "network_alpha=inf"),
        ({"conv_dim": -2}, '"conv_dim=-2"'),
        ({"conv_alpha": -1.0}, '"conv_alpha"'),
        ({"use_tucker": "false"}, "\"use_tucker='false'\": use_tucker must be true or false"),
        ({"algo": "loha", "factor": 4}, 'only LoKr uses factor, but algo=loha; remove it or set algo=lokr'),
        ({"algo": "locon", "decompose_both": True}, "only LoKr uses decompose_both"),
        ({"algo": "lora", "full_matrix": True}, "only LoKr uses full_matrix"),
        ({"algo": "loha", "unbalanced_factorization": True}, "only LoKr uses unbalanced"),
        ({"wd_on_output": False}, "set dora_wd=true"),
    ],
)  # fmt: skip
def test_bad_values_name_the_key_and_the_fix(kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        LycorisSpec(**kwargs)
    assert message in str(info.value)


def test_lokr_options_are_accepted_for_lokr() -> None:
    spec = LycorisSpec(
        algo="lokr", factor=8, decompose_both=True, full_matrix=True,
        unbalanced_factorization=True, dora_wd=True, wd_on_output=False, use_tucker=True,
        use_scalar=True, rs_lora=True, alpha=0,
    )  # fmt: skip
    assert spec.module_algo == "lokr" and spec.alpha == 0.0


def test_factorization_matches_lycoris() -> None:
    from lycoris.functional.general import factorization as reference

    factors = [-2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 32, 64, 100]
    for dimension in [*range(1, 300), 320, 360, 512, 640, 768, 1024, 1280, 2048, 3072, 5120]:
        for factor in factors:
            assert factorization(dimension, factor) == reference(dimension, factor), (
                dimension,
                factor,
            )
    assert factorization(128) == (8, 16) and factorization(250, 4) == (2, 125)
    with pytest.raises(ValueError):
        factorization(0)
