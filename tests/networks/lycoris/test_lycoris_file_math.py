"""file_math: a saved module's weight change and merged weight, against LyCORIS and our layer."""

from __future__ import annotations

import pytest
import torch

from library.networks.lycoris import file_math
from tests.networks.lora_merge import lora_delta
from tests.networks.lycoris.reference import (
    CASE_PARAMS,
    Case,
    reference_delta,
    reference_merged,
    reference_pair,
)

TIGHT = {"rtol": 1e-5, "atol": 1e-5}


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_lycoris_files_merge_as_lycoris_computes(case: Case) -> None:
    """LyCORIS' saved tensors (its state_dict) through file_math give its own weights."""
    base, ours, ref = reference_pair(case)
    sd = {k: v.detach() for k, v in ref.state_dict().items()}
    expected_algo = {"lora": "locon"}.get(case.algo, case.algo)
    assert file_math.module_algo(sd) == expected_algo
    torch.testing.assert_close(
        file_math.module_delta(sd, base.weight.shape), reference_delta(ref), **TIGHT
    )
    for multiplier in (1.0, 0.5):
        torch.testing.assert_close(
            file_math.merged_weight(base.weight, sd, multiplier),
            reference_merged(ref, multiplier),
            **TIGHT,
        )
        # and our layer's own files read back to the layer's weights
        torch.testing.assert_close(
            file_math.merged_weight(base.weight, ours.file_tensors(), multiplier),
            ours.merged_weight(multiplier),
            **TIGHT,
        )
    torch.testing.assert_close(
        file_math.module_delta(ours.file_tensors(), base.weight.shape), ours.delta_weight()
    )


@pytest.mark.parametrize("shape", [(40, 24), (12, 8, 1, 1), (12, 8, 3, 3)])
def test_kohya_plain_lora_matches_the_lora_merge(shape) -> None:
    gen = torch.Generator().manual_seed(0)
    rank, kernel = 4, shape[2:]
    down = torch.randn(rank, shape[1], *kernel, generator=gen)
    up = torch.randn(shape[0], rank, *(1,) * len(kernel), generator=gen)
    parts = {"lora_down.weight": down, "lora_up.weight": up, "alpha": torch.tensor(2.0)}
    expected = lora_delta(down, up, 2.0 / rank, torch.Size(shape))
    torch.testing.assert_close(file_math.module_delta(parts, shape), expected, **TIGHT)
    no_alpha = {k: v for k, v in parts.items() if k != "alpha"}
    torch.testing.assert_close(
        file_math.module_delta(no_alpha, shape), expected * rank / 2.0, **TIGHT
    )
    weight = torch.randn(shape, generator=gen)
    torch.testing.assert_close(
        file_math.merged_weight(weight, parts, 0.7), weight + 0.7 * expected, **TIGHT
    )


def test_pointwise_conv_reads_matrix_shaped_factors() -> None:
    gen = torch.Generator().manual_seed(1)
    down, up = torch.randn(4, 8, generator=gen), torch.randn(12, 4, generator=gen)
    flat = {"lora_down.weight": down, "lora_up.weight": up, "alpha": torch.tensor(4.0)}
    conv = {
        **flat,
        "lora_down.weight": down[..., None, None],
        "lora_up.weight": up[..., None, None],
    }
    torch.testing.assert_close(
        file_math.module_delta(flat, (12, 8, 1, 1)), file_math.module_delta(conv, (12, 8, 1, 1))
    )


@pytest.mark.parametrize("on_output", [True, False])
def test_dora_axis_is_read_from_the_scale_shape_on_a_square_layer(on_output: bool) -> None:
    # a square layer: only the dora_scale orientation tells the axis
    square = torch.nn.Linear(24, 24)
    weight = square.weight.detach() * 3
    gen = torch.Generator().manual_seed(4)
    parts = {
        "hada_w1_a": torch.randn(24, 4, generator=gen) * 0.3,
        "hada_w1_b": torch.randn(4, 24, generator=gen) * 0.3,
        "hada_w2_a": torch.randn(24, 4, generator=gen) * 0.3,
        "hada_w2_b": torch.randn(4, 24, generator=gen) * 0.3,
        "alpha": torch.tensor(2.0),
        "dora_scale": torch.rand((24, 1) if on_output else (1, 24), generator=gen) + 0.5,
    }
    assert file_math.dora_on_output(parts["dora_scale"], weight.shape) is on_output
    from lycoris.functional.general import weight_decompose

    delta = file_math.module_delta(parts, weight.shape)
    expected = weight_decompose(weight + delta, parts["dora_scale"], 1.0, on_output)
    torch.testing.assert_close(file_math.merged_weight(weight, parts), expected, **TIGHT)


def _parts(case: Case) -> tuple[torch.Size, dict[str, torch.Tensor]]:
    base, ours, _ = reference_pair(case)
    return base.weight.shape, ours.file_tensors()


def test_unknown_and_mixed_suffixes_are_value_errors_naming_the_key() -> None:
    shape, parts = _parts(Case("loha", "linear"))
    with pytest.raises(ValueError, match="'oft_blocks'.*OFT"):
        file_math.module_delta({**parts, "oft_blocks": torch.zeros(2)}, shape)
    with pytest.raises(ValueError, match="'scalar'"):
        file_math.module_algo({**parts, "scalar": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="LoHa module.*LoKr module.*lokr_w1"):
        file_math.module_algo({**parts, "lokr_w1": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="no weight tensors"):
        file_math.module_algo({"alpha": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="lacks its hada_w2_b"):
        file_math.module_delta({k: v for k, v in parts.items() if k != "hada_w2_b"}, shape)


@pytest.mark.parametrize(
    ("case", "key", "bad_shape"),
    [
        (Case("locon", "conv3"), "lora_down.weight", (4, 8, 1, 1)),
        (Case("locon", "conv3", opts={"use_tucker": True}), "lora_mid.weight", (4, 4, 1, 1)),
        (Case("loha", "linear"), "hada_w2_a", (41, 4)),
        (Case("loha", "conv3", opts={"use_tucker": True}), "hada_t2", (4, 3, 3, 3)),
        (Case("lokr", "linear", dim=2), "lokr_w2_b", (2, 5)),
        (Case("lokr", "conv3", dim=2, opts={"factor": 2, "use_tucker": True}), "lokr_w2_a", (2, 5)),
        (Case("lokr", "linear", dim=2), "lokr_w1", (3, 4)),
        (Case("locon", "linear", opts={"dora_wd": True}), "dora_scale", (40,)),
    ],
    ids=lambda v: v.id if isinstance(v, Case) else str(v),
)
def test_wrong_shapes_are_value_errors_naming_the_key(case, key, bad_shape) -> None:
    shape, parts = _parts(case)
    parts[key] = torch.zeros(bad_shape)
    with pytest.raises(ValueError, match=key):
        file_math.module_delta(parts, shape)
    with pytest.raises(ValueError, match=key):
        file_math.merged_weight(torch.zeros(shape), parts)


def test_lokr_full_halves_ignore_alpha_and_alpha_zero_means_rank() -> None:
    shape, parts = _parts(Case("lokr", "linear", dim=4))  # both halves full
    assert file_math.module_rank(parts) is None
    raw = file_math.module_delta({**parts, "alpha": torch.tensor(1.0)}, shape)
    torch.testing.assert_close(
        file_math.module_delta({**parts, "alpha": torch.tensor(7.0)}, shape), raw
    )
    shape, parts = _parts(Case("locon", "linear"))
    unscaled = file_math.module_delta({**parts, "alpha": torch.tensor(4.0)}, shape)  # alpha = rank
    torch.testing.assert_close(
        file_math.module_delta({**parts, "alpha": torch.tensor(0.0)}, shape), unscaled
    )
