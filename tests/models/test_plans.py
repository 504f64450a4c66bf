"""The one plan system (library/models/plans.py): the config tried first is the file's header's,
then each candidate in order (a shipped config, one derived from the shapes); a file cut short of
what its header promises is refused, never built smaller; what none fits is said naming the
file; loading reads, renames and freezes. Checked on a two-layer MLP whose sizes are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.plans import CONFIG_METADATA, Plan, choose_plan, load_plan


def build(config: dict) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(config["width"], config["hidden"]),
        torch.nn.Linear(config["hidden"], config["width"]),
    )


def mlp_file(width: int, hidden: int, header: dict | None = None, drop: str = "") -> CheckpointFile:
    """An MLP's tensors in "original" names (fc1/fc2), optionally without ``drop`` and with a
    stored config."""
    model = build({"width": width, "hidden": hidden})
    names = {"0": "fc1", "1": "fc2"}
    tensors = {f"net.{names[k[0]]}{k[1:]}": v for k, v in model.state_dict().items()}
    tensors = {k: v for k, v in tensors.items() if not (drop and k.startswith(drop))}
    metadata = {CONFIG_METADATA + "mlp": json.dumps(header)} if header else {}
    return CheckpointFile(Path("mlp.safetensors"), tensors=tensors, metadata=metadata)


def convert(state):
    back = {"fc1": "0", "fc2": "1"}
    out = {}
    for key, value in state.items():
        _net, layer, param = key.split(".")
        if layer not in back:
            raise ValueError(f"{key} has no place in the MLP")
        out[f"{back[layer]}.{param}"] = value
    return out


def plan(file: CheckpointFile, *candidates) -> Plan:
    def plan_of(config: dict) -> Plan:
        return Plan("mlp", "mlp_file", file, list(file.keys()), config, convert, build)

    return choose_plan("mlp", plan_of, file, candidates)


def shipped(width=4, hidden=8):
    return ("shipped", lambda: {"width": width, "hidden": hidden})


def derived(file):
    return ("derived", lambda: {"width": file.shape("net.fc1.weight")[1],
                                "hidden": file.shape("net.fc1.weight")[0]})  # fmt: skip


def test_header_then_candidates_in_order():
    file = mlp_file(4, 8, header={"width": 4, "hidden": 8})
    assert plan(file, shipped(), derived(file)).source == "metadata"
    file = mlp_file(4, 8)
    assert plan(file, shipped(), derived(file)).source == "shipped"
    file = mlp_file(4, 6)  # a pruned model: the shipped config does not fit, the shapes do
    chosen = plan(file, shipped(), derived(file))
    assert (chosen.source, chosen.config) == ("derived", {"width": 4, "hidden": 6})
    stale = mlp_file(4, 6, header={"width": 3, "hidden": 3})  # a stale header: the shapes decide
    assert plan(stale, derived(stale)).config == {"width": 4, "hidden": 6}


def test_a_file_cut_short_of_its_header_is_refused():
    file = mlp_file(4, 8, header={"width": 4, "hidden": 8}, drop="net.fc2.")
    with pytest.raises(ModelError) as error:
        plan(file, derived(file))
    message = str(error.value)
    assert message.startswith("mlp_file = mlp.safetensors: its header (difftune.config.mlp)")
    assert "2 tensors the file does not hold (e.g. 1.bias)" in message and "truncated" in message


def test_no_fitting_config_names_the_file_and_the_tensor():
    file = mlp_file(4, 8)
    file._tensors["net.fc3.weight"] = torch.zeros(1)
    with pytest.raises(ModelError, match=r"mlp_file = mlp.safetensors: cannot build the mlp: .*fc3"):
        plan(file, shipped())


def test_load_reads_renames_and_freezes():
    file = mlp_file(4, 8)
    module = load_plan(plan(file, shipped()), torch.bfloat16)
    assert torch.equal(module[1].weight, file.tensor("net.fc2.weight").to(torch.bfloat16))
    assert not module.training and not any(p.requires_grad for p in module.parameters())
