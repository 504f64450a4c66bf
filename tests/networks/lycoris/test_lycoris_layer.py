"""LycorisLayer against LyCORIS' own modules: outputs, gradients, weights, files, init, max-norm."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from library.networks.lycoris.layer import LycorisLayer
from library.networks.lycoris.spec import LycorisSpec
from tests.networks.lycoris.reference import (
    CASE_PARAMS,
    Case,
    functional_delta,
    make_base,
    make_input,
    make_ours,
    make_reference,
    our_param_names,
    randomize_reference,
    reference_delta,
    reference_merged,
    reference_pair,
    reference_param_names,
    reload_reference,
)

TIGHT = {"rtol": 1e-5, "atol": 1e-5}


@pytest.mark.parametrize("case", CASE_PARAMS)
@pytest.mark.parametrize("multiplier", [1.0, 0.5])
def test_forward_matches_lycoris(case: Case, multiplier: float) -> None:
    _, ours, ref = reference_pair(case)
    ours.multiplier = ref.multiplier = multiplier
    x = make_input(case)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), **TIGHT)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_gradients_match_lycoris(case: Case) -> None:
    """Every adapter tensor (scalar and dora_scale too) and the input get LyCORIS' gradients;
    DoRA's norm is not detached in LyCORIS, and the dora_scale/factor gradients show it."""
    _, ours, ref = reference_pair(case)
    reload_reference(ref)  # scalar folded into the factor and reset to 1, as in our loaded layer
    x = make_input(case)
    grad_out = torch.randn_like(ref(x), generator=torch.Generator().manual_seed(9))
    x_ours, x_ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (ours(x_ours) * grad_out).sum().backward()
    (ref(x_ref) * grad_out).sum().backward()
    ours_params, ref_params = our_param_names(ours), reference_param_names(ref)
    assert sorted(ours_params) == sorted(ref_params)
    for name, param in ours_params.items():
        assert param.grad is not None, name
        torch.testing.assert_close(param.grad, ref_params[name].grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    assert ours.base_layer.weight.grad is None


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_weights_match_lycoris(case: Case) -> None:
    base, ours, ref = reference_pair(case)
    torch.testing.assert_close(ours.delta_weight(), reference_delta(ref), **TIGHT)
    # the file alone, through LyCORIS' functional API, means the same change
    sd = {k: v.detach() for k, v in ref.state_dict().items()}
    torch.testing.assert_close(
        ours.delta_weight(), functional_delta(sd, base.weight.shape), **TIGHT
    )
    for multiplier in (1.0, 0.5):
        torch.testing.assert_close(
            ours.merged_weight(multiplier), reference_merged(ref, multiplier), **TIGHT
        )
    assert ours.delta_weight().dtype == torch.float32
    assert ours.delta_weight().shape == base.weight.shape


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_file_tensors_match_lycoris(case: Case) -> None:
    _, ours, ref = reference_pair(case)
    saved = ours.file_tensors()
    expected = ref.state_dict()
    assert sorted(saved) == sorted(expected)
    for key, value in saved.items():
        assert value.dtype == torch.float32, key
        assert not value.requires_grad, key
        assert value.shape == expected[key].shape, key
        torch.testing.assert_close(value, expected[key].detach().float(), rtol=1e-6, atol=1e-7)
    assert saved["alpha"].dim() == 0
    assert ours.saved_numbers() == sum(v.numel() for v in saved.values())
    # copies: changing them leaves the layer alone
    for value in saved.values():
        value.add_(1.0)
    torch.testing.assert_close(ours.file_tensors()["alpha"], expected["alpha"].float())


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_initial_layer_is_the_base_layer_with_lycoris_shapes(case: Case) -> None:
    base = make_base(case.base)
    ours = make_ours(case, base)
    ref = make_reference(case, base)  # fresh: LyCORIS' own initialisation
    x = make_input(case)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), base(x), **TIGHT)
    saved, expected = ours.file_tensors(), ref.state_dict()
    assert {k: tuple(v.shape) for k, v in saved.items()} == {
        k: tuple(v.shape) for k, v in expected.items()
    }
    for key, value in expected.items():
        value = value.detach()
        # which tensors start at zero, and the spread of the random ones, follow LyCORIS
        mine = saved[key]
        if key in ("alpha", "dora_scale"):
            torch.testing.assert_close(mine, value.detach().float())
        elif not value.any():
            assert not mine.any(), key
        else:
            assert mine.any(), key
            if value.numel() >= 16:
                ratio = float(mine.std() / value.std())
                assert 0.6 < ratio < 1.6, (key, ratio)
            if key.startswith(("lora_", "lokr_")):
                # Kaiming-uniform with a=sqrt(5): |w| <= 1 / sqrt(fan_in), for both
                bound = value[0].numel() ** -0.5 + 1e-6
                assert float(value.abs().max()) <= bound, key
                assert float(mine.abs().max()) <= bound, key
    if case.opts.get("use_scalar"):
        assert ours.scalar.item() == 0.0 and ref.scalar.item() == 0.0


@pytest.mark.parametrize("case", CASE_PARAMS)
@pytest.mark.parametrize("fraction", [0.5, 2.0])
def test_max_norm_follows_lycoris(case: Case, fraction: float) -> None:
    _, ours, ref = reference_pair(case)
    reload_reference(ref)
    before = float(ours.delta_weight().norm())
    limit = fraction * before
    norm, scaled = ours.apply_max_norm(limit)
    ref_scaled, ref_after = ref.apply_max_norm(limit)
    assert norm == pytest.approx(before, rel=1e-5)
    assert scaled == bool(ref_scaled) == (fraction < 1)
    after = float(ours.delta_weight().norm())
    assert after == pytest.approx(min(before, limit), rel=1e-4)
    assert float(ref_after) == pytest.approx(after, rel=1e-4)
    x = make_input(case)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), **TIGHT)
        torch.testing.assert_close(ours.merged_weight(), reference_merged(ref, 1.0), **TIGHT)


@pytest.mark.parametrize("case", CASE_PARAMS[::3])
def test_output_per_sample_does_not_depend_on_the_batch(case: Case) -> None:
    _, ours, _ = reference_pair(case)
    ours.train()
    x = make_input(case, batch=4)
    together = ours(x)
    alone = torch.cat([ours(x[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
    assert together.requires_grad


def test_lokr_full_halves_have_scale_one_even_with_rs_lora() -> None:
    """Both LoKr halves full: scale 1 (alpha forced). With rs_lora LyCORIS' trainer would use
    sqrt(rank), but its own loader and every reader give such a file scale 1; so do we."""
    from lycoris.modules import make_module
    from lycoris.modules.lokr import LokrModule

    case = Case("lokr", "linear", dim=4, opts={"rs_lora": True})
    base = make_base("linear")
    ref = make_reference(case, base)
    randomize_reference(ref)
    sd = ref.state_dict()
    assert float(sd["alpha"]) == pytest.approx(4 * 4 / 4**0.5)  # what LyCORIS saves
    ours = make_ours(case, base)
    assert ours.scale == 1.0
    assert float(ours.file_tensors()["alpha"]) == pytest.approx(float(sd["alpha"]))
    ours.load_file_tensors(sd, "rs.safetensors")
    assert ours.scale == 1.0
    loaded = make_module(
        LokrModule, [sd.get(k) for k in LokrModule.weight_list], "ref", copy.deepcopy(base)
    )
    x = make_input(case)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), loaded(x), **TIGHT)
    torch.testing.assert_close(ours.delta_weight(), functional_delta(sd, base.weight.shape))


def test_file_alpha_wins_over_the_configured_one() -> None:
    case = Case("loha", "conv3", dim=4, alpha=2.0)
    base, ours, ref = reference_pair(case)
    sd = dict(ref.state_dict())
    sd["alpha"] = torch.tensor(8.0)
    ref8 = make_reference(Case("loha", "conv3", dim=4, alpha=8.0), base)
    ref8.load_state_dict(sd)
    ours.load_file_tensors(sd, "alpha8.safetensors")
    assert ours.scale == pytest.approx(2.0)
    assert float(ours.file_tensors()["alpha"]) == 8.0
    x = make_input(case)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref8(x), **TIGHT)


def test_conv_layers_take_conv_dim_and_conv_alpha() -> None:
    spec = LycorisSpec(algo="locon", dim=4, alpha=1.0, conv_dim=2, conv_alpha=4.0)
    conv3 = LycorisLayer(make_base("conv3"), spec, "conv", generator=0)
    conv1 = LycorisLayer(make_base("conv1"), spec, "linear", generator=0)
    linear = LycorisLayer(make_base("linear"), spec, "linear", generator=0)
    assert (conv3.rank, conv3.scale) == (2, 2.0)
    assert conv3.file_tensors()["lora_down.weight"].shape == (2, 8, 3, 3)
    assert (conv1.rank, conv1.scale) == (4, 0.25)
    assert conv1.file_tensors()["lora_up.weight"].shape == (12, 4, 1, 1)
    assert (linear.rank, linear.scale) == (4, 0.25)


def test_layer_kind_and_unsupported_layers_are_refused() -> None:
    spec = LycorisSpec()
    with pytest.raises(ValueError, match='"conv" layer for LyCORIS, not "linear"'):
        LycorisLayer(make_base("conv3"), spec, "linear")
    with pytest.raises(ValueError, match='"linear" layer'):
        LycorisLayer(make_base("conv1"), spec, "conv")
    with pytest.raises(ValueError, match="groups=1"):
        LycorisLayer(nn.Conv2d(8, 12, 3, groups=2), spec, "conv")
    with pytest.raises(ValueError, match="nn.Linear and nn.Conv2d"):
        LycorisLayer(nn.Conv1d(8, 12, 3), spec, "conv")


def test_parameters_are_float32_trainable_and_the_base_is_frozen() -> None:
    spec = LycorisSpec(algo="lokr", dim=2, decompose_both=True, use_scalar=True, dora_wd=True)
    layer = LycorisLayer(make_base("linear"), spec, "linear", generator=0)
    params = layer.adapter_parameters()
    names = {id(p): n for n, p in our_param_names(layer).items()}
    assert [names[id(p)] for p in params] == [
        "lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b", "scalar", "dora_scale",
    ]  # fmt: skip
    assert all(p.dtype == torch.float32 and p.requires_grad for p in params)
    assert not any(p.requires_grad for p in layer.base_layer.parameters())


def test_generator_makes_initialisation_deterministic() -> None:
    spec = LycorisSpec(algo="loha", dim=4)
    one = LycorisLayer(make_base("linear"), spec, "linear", generator=7).file_tensors()
    two = LycorisLayer(make_base("linear"), spec, "linear", generator=7).file_tensors()
    three = LycorisLayer(make_base("linear"), spec, "linear", generator=8).file_tensors()
    for key in one:
        torch.testing.assert_close(one[key], two[key], rtol=0, atol=0)
    assert not torch.equal(one["hada_w1_b"], three["hada_w1_b"])


def test_delta_weight_excludes_the_multiplier_and_merged_weight_takes_it() -> None:
    case = Case("locon", "conv3")
    base, ours, _ = reference_pair(case)
    delta = ours.delta_weight()
    ours.multiplier = 0.3
    torch.testing.assert_close(ours.delta_weight(), delta)
    torch.testing.assert_close(ours.merged_weight(0.3), base.weight + 0.3 * delta)
    x = make_input(case)
    with torch.no_grad():
        expected = nn.functional.conv2d(x, ours.merged_weight(0.3), base.bias, padding=1)
        torch.testing.assert_close(ours(x), expected, **TIGHT)


def test_a_model_state_dict_with_another_alpha_sets_the_scale() -> None:
    """Resuming through the model's own load_state_dict keeps scale and alpha buffer together."""
    case = Case("locon", "linear", dim=4, alpha=2.0)
    _, ours, _ = reference_pair(case)
    model = nn.Sequential(ours)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["0.alpha"] = torch.tensor(1.0)
    model.load_state_dict(state)
    assert ours.scale == pytest.approx(0.25)
    torch.testing.assert_close(ours.delta_weight(), ours.lora_up @ ours.lora_down * 0.25)


def test_max_norm_needs_a_positive_limit() -> None:
    _, ours, _ = reference_pair(Case("lokr", "linear", dim=2))
    with pytest.raises(ValueError, match="> 0"):
        ours.apply_max_norm(0.0)
