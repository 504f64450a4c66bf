"""load_file_tensors refuses a file that does not fit the config, naming the fix, and copies nothing."""

from __future__ import annotations

import pytest
import torch

from library.errors import CheckpointError
from tests.networks.lycoris.reference import Case, make_base, make_ours, reference_pair

SOURCE = "my_lyco.safetensors"


def _file(case: Case) -> dict[str, torch.Tensor]:
    _, ours, _ = reference_pair(case)
    return ours.file_tensors()


def _refused(config: Case, tensors: dict[str, torch.Tensor], *needles: str) -> None:
    layer = make_ours(config, make_base(config.base))
    before = {k: v.clone() for k, v in layer.file_tensors().items()}
    scale = layer.scale
    with pytest.raises(CheckpointError) as info:
        layer.load_file_tensors(tensors, SOURCE)
    message = str(info.value)
    assert "\n" not in message
    assert SOURCE in message
    for needle in needles:
        assert needle in message, message
    after = layer.file_tensors()
    for key, value in before.items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=0)
    assert layer.scale == scale


def test_a_loha_file_in_a_lokr_config() -> None:
    tensors = _file(Case("loha", "linear"))
    _refused(
        Case("lokr", "linear", dim=2),
        tensors,
        "holds a LoHa module (hada_w1_a, hada_w1_b, hada_w2_a, hada_w2_b)",
        "network_args says algo=lokr; set algo=loha",
    )


def test_a_locon_file_in_a_loha_config() -> None:
    _refused(Case("loha", "conv3"), _file(Case("lora", "conv3")), "LoCon", "set algo=lora")


@pytest.mark.parametrize(
    ("file_case", "config", "needles"),
    [
        (
            Case("locon", "linear", opts={"dora_wd": True}),
            Case("locon", "linear"),
            ("dora_scale", "set dora_wd=true"),
        ),
        (
            Case("loha", "linear"),
            Case("loha", "linear", opts={"dora_wd": True}),
            ("lacks dora_scale", "set dora_wd=false"),
        ),
        (
            Case("locon", "conv3", opts={"use_tucker": True}),
            Case("locon", "conv3"),
            ("lora_mid.weight", "set use_tucker=true"),
        ),
        (
            Case("loha", "conv3"),
            Case("loha", "conv3", opts={"use_tucker": True}),
            ("hada_t1", "set use_tucker=false"),
        ),
        (
            Case("lokr", "conv3", dim=2, opts={"factor": 2, "use_tucker": True}),
            Case("lokr", "conv3", dim=2, opts={"factor": 2}),
            ("lokr_t2", "set use_tucker=true"),
        ),
        (
            Case("locon", "linear", dim=8),
            Case("locon", "linear", dim=4),
            ("rank-8", "set network_dim=8"),
        ),
        (
            Case("loha", "conv3", dim=3),
            Case("loha", "conv3", dim=4),
            ("rank-3", "set conv_dim=3"),
        ),
        (
            Case("lokr", "linear", dim=2, opts={"dora_wd": True, "wd_on_output": False}),
            Case("lokr", "linear", dim=2, opts={"dora_wd": True}),
            ("dora_scale", "set wd_on_output=false"),
        ),
        (
            Case("lokr", "linear", dim=2, opts={"decompose_both": True}),
            Case("lokr", "linear", dim=2),
            ("lokr_w1_a", "decompose_both"),
        ),
        (
            Case("lokr", "linear", dim=2, opts={"factor": 4}),
            Case("lokr", "linear", dim=2, opts={"factor": 8}),
            ("lokr_w1 has shape [4, 4]", "expects [5, 3]", "factor"),
        ),
    ],
    ids=["dora-extra", "dora-missing", "tucker-extra", "tucker-missing", "lokr-t2", "rank",
         "conv-rank", "dora-axis", "lokr-split", "lokr-factor"],
)  # fmt: skip
def test_config_mismatches_name_the_setting(file_case, config, needles) -> None:
    _refused(config, _file(file_case), *needles)


def test_unknown_missing_and_wrong_shape_suffixes() -> None:
    good = _file(Case("locon", "linear"))
    _refused(Case("locon", "linear"), {**good, "oft_blocks": torch.zeros(1)}, "'oft_blocks'")
    no_alpha = {k: v for k, v in good.items() if k != "alpha"}
    _refused(Case("locon", "linear"), no_alpha, "alpha")
    # the first tensor fits, the second not: nothing is copied (checked in _refused)
    bad_up = {**good, "lora_up.weight": torch.zeros(40, 5)}
    _refused(Case("locon", "linear"), bad_up, "lora_up.weight")
    bad_alpha = {**good, "alpha": torch.tensor(float("nan"))}
    _refused(Case("locon", "linear"), bad_alpha, "alpha is nan")


def test_a_half_precision_file_loads() -> None:
    case = Case("lokr", "conv3", dim=2, opts={"factor": 2, "use_tucker": True})
    tensors = {k: v.half() for k, v in _file(case).items()}
    layer = make_ours(case, make_base(case.base))
    layer.load_file_tensors(tensors, SOURCE)
    for key, value in layer.file_tensors().items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, tensors[key].float())
