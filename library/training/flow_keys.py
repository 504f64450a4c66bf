"""The [flow] keys of the flow-matching draw (kohya's and musubi-tuner's words), readable
without torch: family entries list them among the keys they own, objectives read them."""

from __future__ import annotations

SIGMA_KEYS = ("timestep_sampling", "sigmoid_scale", "discrete_flow_shift", "weighting_scheme",
              "logit_mean", "logit_std", "mode_scale")  # fmt: skip
