"""An exponential moving average (EMA) of the trained weights, saved beside the normal output."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from diffusers.training_utils import EMAModel


class WeightAverage:
    """EMA of ``params`` (diffusers' EMAModel: decay ramps up as (1 + n) / (10 + n) to ``decay``)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float):
        self.params = params
        self.decay = decay
        self._ema = EMAModel(params, decay=decay)
        # the average keeps float32 even for half-precision weights (full_bf16): a 0.999 decay
        # moves each average by less than a bfloat16 step, which would round every update away
        self._ema.shadow_params = [p.float() for p in self._ema.shadow_params]

    def update(self) -> None:
        """Fold the current weights in; call once per applied optimizer step."""
        self._ema.step(self.params)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Temporarily put the averaged weights into the live parameters (e.g. to save them)."""
        self._ema.store(self.params)
        self._ema.copy_to(self.params)
        try:
            yield
        finally:
            self._ema.restore(self.params)

    def state_dict(self) -> dict:
        return self._ema.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._ema.load_state_dict(state)
        self._ema.to(self.params[0].device)
