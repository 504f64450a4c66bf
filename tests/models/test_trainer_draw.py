"""The flow-matching draw each transformer family's LoRA files record (kohya's ss_* header keys):
its trainer's suggested draw (musubi-tuner's guides) with the set [flow] keys over it, written
here from those guides' values, one family at a time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from library.config.flow_schema import FlowSection
from library.models.families.flux2.family import flux2_family
from library.models.families.krea2.family import krea2_family
from library.models.families.qwenimage.family import qwenimage_family
from library.models.families.wan.family import WAN
from library.models.families.zimage.family import zimage_family

# FlowOptions' own values where a trainer suggests none (kohya's defaults)
_KOHYA = {"sigmoid_scale": 1.0, "logit_mean": 0.0, "logit_std": 1.0, "mode_scale": 1.29}


def _shift(shift: float) -> dict:
    """musubi-tuner's fixed-shift draw, with every draw key kohya writes."""
    return {"timestep_sampling": "shift", "discrete_flow_shift": shift, "weighting_scheme": "none",
            **_KOHYA}  # fmt: skip


_FLUX2 = {"timestep_sampling": "flux_shift", "sigmoid_scale": 1.0, "discrete_flow_shift": 3.0,
          "weighting_scheme": "none", "model_prediction_type": "raw"}  # fmt: skip
CASES = {
    "flux2-klein": (flux2_family("klein", "4b", False), _FLUX2),
    "flux2-dev": (flux2_family("dev", "32b", False), {**_FLUX2, "guidance_scale": 4.0}),
    "krea2": (krea2_family(), {"timestep_sampling": "shift", "discrete_flow_shift": 2.5,
                               "weighting_scheme": "none", "sigmoid_scale": 1.0}),
    "qwenimage": (qwenimage_family(), _shift(2.2)),
    "zimage": (zimage_family("turbo", 3.0), _shift(2.0)),
    "wan": (WAN, {"model_type": "wan", **_shift(3.0)}),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_files_record_the_trainers_draw_and_the_set_keys(name):
    family, expected = CASES[name]
    unset = family.metadata_keys(SimpleNamespace(flow=FlowSection()))
    assert unset == {f"ss_{key}": value for key, value in expected.items()}
    given = FlowSection(discrete_flow_shift=5.0, timestep_sampling="sigmoid")
    changed = family.metadata_keys(SimpleNamespace(flow=given))
    assert changed["ss_discrete_flow_shift"] == 5.0
    assert changed["ss_timestep_sampling"] == "sigmoid"
