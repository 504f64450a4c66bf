"""An exponential moving average (EMA) of the trained weights, saved beside the normal output."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from diffusers.training_utils import EMAModel

from library.training.sharding import full_value, is_sharded, shard_like


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

    @contextmanager
    def gathered(self, whole: dict[int, torch.nn.Parameter], keep: bool) -> Iterator[None]:
        """While inside (FSDP, library/training/sharding.py): on the process with ``keep``, the
        averages of sharded weights are whole, in host memory, and pair with ``whole`` (id of a
        sharded parameter -> its whole stand-in), so swapped_in and state_dict see an unsharded
        model. Every process must enter: the gathers are collectives."""
        shadows = [full_value(s, keep) if is_sharded(s) else s for s in self._ema.shadow_params]
        if not keep:
            yield
            return
        params, saved = self.params, self._ema.shadow_params
        self.params = [whole.get(id(p), p) for p in params]
        self._ema.shadow_params = shadows
        try:
            yield
        finally:
            self.params, self._ema.shadow_params = params, saved

    def state_dict(self) -> dict:
        return self._ema.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Load a saved average (whole tensors); each is placed as its weight is (this
        process's slice of a sharded weight)."""
        self._ema.load_state_dict(state)
        self._ema.shadow_params = [
            shard_like(s, p, torch.float32)
            for s, p in zip(self._ema.shadow_params, self.params, strict=True)
        ]
