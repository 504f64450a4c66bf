"""Every registered family with a test kit declares its distributed equivalence modes.

A family's kit (ConformanceKit.distributed, in its tests/kits/<family>/kit.py) declares the modes in which
tests/distributed trains the same 4 samples as 2 processes x accumulation 2 and as one process
(x 4, and batch 4) and compares the weights: the config keys of every layout, the 2-process
run's DDP-side option, the variant whose tiny folder the runs train on, its own captions,
whether the run resumes and whether it shards (tests.kits.conformance_kit.DistributedMode).
tests/distributed/suite.py builds its family modes from the registry, so a family registered
with a kit gets its runs without an edit there; these checks make sure it declares them, or
names why it has none (``skips["distributed"]``, said as the skip's reason).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from library.models.families import registry
from tests.distributed.suite import FAMILY_MODES, MODES, TRAINER_MODES, family_modes
from tests.kits import kit_of, registered_kit
from tests.kits.conformance_kit import DistributedMode


def distributed_gap(label: str, kit) -> str | None:
    """What is wrong with the distributed modes ``kit`` (the family ``label``'s) declares, in
    words; None: nothing (a kit without modes that names why in its skips passes)."""
    if not kit.distributed:
        if kit.skips.get("distributed"):
            return None
        return (
            f"{label}'s test kit declares no distributed equivalence mode "
            "(ConformanceKit.distributed, see tests/kits/conformance_kit.py) and names no "
            'reason for having none (ConformanceKit.skips["distributed"])'
        )
    for mode in kit.distributed:
        if mode.variant is not None and mode.variant not in kit.variants:
            return (
                f"{label}'s distributed mode {mode.name} trains variant {mode.variant!r}, "
                f"which is none of the kit's {kit.variants}"
            )
    return None


def _kit_families() -> list[str]:
    return [entry.name for entry in registry.families() if kit_of(entry.name)]


@pytest.mark.parametrize("name", _kit_families())
def test_each_family_declares_its_distributed_modes(name):
    entry = registry.family_entry(name)
    kit = kit_of(name)
    if not kit.distributed and kit.skips.get("distributed"):
        pytest.skip(f"{entry.label}: {kit.skips['distributed']}")
    assert distributed_gap(entry.label, kit) is None, distributed_gap(entry.label, kit)
    # ...and the distributed suite runs them, as this family's
    for mode in kit.distributed:
        assert FAMILY_MODES[mode.name] == (name, mode)
        assert MODES[mode.name] is mode


def test_the_check_fails_a_kit_without_modes_or_reason():
    kit = kit_of("sd")
    bare = replace(kit, distributed=(), skips={})
    assert "declares no distributed equivalence mode" in distributed_gap("Made-up", bare)
    assert distributed_gap("Made-up", replace(bare, skips={"distributed": "why"})) is None
    wrong = replace(kit, distributed=(DistributedMode(name="made-up-lora", variant="nope"),))
    assert "none of the kit's" in distributed_gap("Made-up", wrong)


def test_mode_names_are_unique_and_a_new_family_gets_its_modes():
    names = [mode.name for entry in registry.families() if kit_of(entry.name)
             for mode in kit_of(entry.name).distributed] + [mode.name for mode in TRAINER_MODES]  # fmt: skip
    assert len(names) == len(set(names)), names
    # a family registered with a kit that declares a mode is in the suite's family modes...
    sd = registry.family_entry("sd")
    mode = DistributedMode(name="made-up-lora", keys={"network_train_unet_only": True})
    kit = replace(kit_of("sd"), distributed=(mode,))
    with registry.registered(replace(sd, name="made-up")), registered_kit("made-up", kit):
        assert family_modes()["made-up-lora"] == ("made-up", mode)
    # ...and one whose mode takes another's name is refused
    taken = replace(kit, distributed=(replace(mode, name="unet+te-lora"),))
    entry = replace(sd, name="made-up")
    with (
        registry.registered(entry),
        registered_kit("made-up", taken),
        pytest.raises(ValueError, match="unet\\+te-lora"),
    ):
        family_modes()
