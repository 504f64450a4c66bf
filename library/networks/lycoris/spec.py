"""One run's LyCORIS adapter settings, with the meaning and defaults of LyCORIS' network_args.

``network_dim``/``network_alpha`` (here ``dim``/``alpha``) rank and scale Linear layers and 1x1
convs; ``conv_dim``/``conv_alpha`` rank and scale kxk convs and default to ``dim``/``alpha`` when
unset or 0, as ``lycoris.kohya.create_network`` does. An alpha of 0 means "no scaling"
(alpha = rank). Only LoRA/LoCon, LoHa and LoKr are implemented; bypass_mode, block_size,
constraint/rescaled, dropouts and the other algorithms are not fields (the config layer refuses
them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ALGOS = ("lora", "locon", "loha", "lokr")

# The module each algo name builds: "lora" and "locon" are one algorithm (LoCon).
_MODULE_ALGO = {"lora": "locon", "locon": "locon", "loha": "loha", "lokr": "lokr"}

LayerKind = Literal["linear", "conv"]


def normalize_algo(name: str) -> str:
    """The network_args ``algo`` value lower-cased and stripped; ValueError unless in ALGOS."""
    algo = str(name).strip().lower()
    if algo not in ALGOS:
        raise ValueError(
            f'network_args "algo={name}": difftune implements algo {", ".join(ALGOS)}; '
            "choose one of them"
        )
    return algo


def module_algo(name: str) -> str:
    """ "locon", "loha" or "lokr": the algorithm an algo name builds ("lora" is LoCon)."""
    return _MODULE_ALGO[normalize_algo(name)]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class LycorisSpec:
    """Adapter settings of one run; ``conv_dim``/``conv_alpha`` None or 0 take ``dim``/``alpha``.

    After construction every field holds its effective value (``conv_dim`` and ``conv_alpha``
    resolved, ``algo`` lower-cased).
    """

    algo: str = "lora"
    dim: int = 4
    alpha: float = 1.0
    conv_dim: int | None = None
    conv_alpha: float | None = None
    factor: int = -1
    decompose_both: bool = False
    use_tucker: bool = False
    use_scalar: bool = False
    full_matrix: bool = False
    unbalanced_factorization: bool = False
    dora_wd: bool = False
    wd_on_output: bool = True
    rs_lora: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "algo", normalize_algo(self.algo))
        if not _is_int(self.dim) or self.dim < 1:
            raise ValueError(f"network_dim={self.dim!r}: the rank must be a positive integer")
        self._check_alpha("network_alpha", self.alpha)
        conv_dim = self.conv_dim
        if conv_dim is not None and (not _is_int(conv_dim) or conv_dim < 0):
            raise ValueError(
                f'network_args "conv_dim={conv_dim!r}": conv_dim must be a positive integer '
                "(or unset to use network_dim)"
            )
        if self.conv_alpha is not None:
            self._check_alpha('network_args "conv_alpha"', self.conv_alpha)
        # LyCORIS: int(conv_dim or network_dim), float(conv_alpha or network_alpha).
        object.__setattr__(self, "conv_dim", int(conv_dim or self.dim))
        object.__setattr__(self, "conv_alpha", float(self.conv_alpha or self.alpha))
        object.__setattr__(self, "alpha", float(self.alpha))
        if not _is_int(self.factor) or self.factor == 0 or self.factor < -1:
            raise ValueError(
                f'network_args "factor={self.factor!r}": factor must be -1 (balanced split) '
                "or a positive integer"
            )
        for name in (
            "decompose_both",
            "use_tucker",
            "use_scalar",
            "full_matrix",
            "unbalanced_factorization",
            "dora_wd",
            "wd_on_output",
            "rs_lora",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f'network_args "{name}={value!r}": {name} must be true or false')
        if self.module_algo != "lokr":
            lokr_only = {
                "factor": self.factor != -1,
                "decompose_both": self.decompose_both,
                "full_matrix": self.full_matrix,
                "unbalanced_factorization": self.unbalanced_factorization,
            }
            for name, is_set in lokr_only.items():
                if is_set:
                    raise ValueError(
                        f'network_args "{name}={getattr(self, name)}": only LoKr uses {name}, '
                        f"but algo={self.algo}; remove it or set algo=lokr"
                    )
        if not self.wd_on_output and not self.dora_wd:
            raise ValueError(
                'network_args "wd_on_output=False": wd_on_output only matters with DoRA; '
                "remove it or set dora_wd=true"
            )

    @classmethod
    def from_config(
        cls,
        options: dict[str, object],
        dim: int,
        alpha: float,
        conv_dim: int | None,
        conv_alpha: float | None,
    ) -> LycorisSpec:
        """The spec of a run: ``options`` are the [adapter] keys that are set (LyCORIS'
        network_args), the ranks and alphas those of [network]; ValueError naming the
        network_args item LyCORIS would refuse."""
        fields = {k: v for k, v in options.items() if k in cls.__dataclass_fields__}
        return cls(
            dim=dim,
            alpha=float(alpha),
            # LyCORIS: the conv rank and alpha default to the linear ones
            conv_dim=conv_dim or dim,
            conv_alpha=float(conv_alpha or alpha),
            **fields,
        )

    @staticmethod
    def _check_alpha(name: str, value: object) -> None:
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise ValueError(
                f"{name}={value!r}: alpha must be a finite number >= 0 (0 means alpha = rank)"
            )

    @classmethod
    def from_network_args(
        cls,
        network_dim: int | None = None,
        network_alpha: float | None = None,
        *,
        algo: str | None = None,
        conv_dim: int | None = None,
        conv_alpha: float | None = None,
        factor: int | None = None,
        **flags: bool,
    ) -> LycorisSpec:
        """Build from kohya's --network_dim/--network_alpha and already-typed network_args.

        Unset values take LyCORIS' defaults: rank 4, alpha 1 (kohya's --network_alpha
        default), algo "lora", factor -1, conv_dim/conv_alpha the linear ones.
        """
        return cls(
            algo=algo or "lora",
            dim=4 if network_dim is None else network_dim,
            alpha=1.0 if network_alpha is None else network_alpha,
            conv_dim=conv_dim,
            conv_alpha=conv_alpha,
            factor=-1 if factor is None else factor,
            **flags,
        )

    @property
    def module_algo(self) -> str:
        """ "locon", "loha" or "lokr" ("lora" is LoCon)."""
        return _MODULE_ALGO[self.algo]

    def rank_for(self, kind: LayerKind) -> int:
        """The rank of a "linear" (Linear, 1x1 conv) or "conv" (kxk conv) layer."""
        return int(self.dim if kind == "linear" else self.conv_dim)

    def alpha_for(self, kind: LayerKind) -> float:
        """The configured alpha of a "linear" or "conv" layer (0: alpha = rank)."""
        return float(self.alpha if kind == "linear" else self.conv_alpha)

    def rank_key(self, kind: LayerKind) -> str:
        """The setting a user changes to change the rank of a layer of ``kind``."""
        return "network_dim" if kind == "linear" else "conv_dim"
