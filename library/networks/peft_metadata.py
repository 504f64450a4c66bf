"""diffusers' ``lora_adapter_metadata`` header: the one reader of it.

diffusers' ``save_lora_weights`` writes each component's peft ``LoraConfig`` into the
safetensors header as one JSON object, its fields prefixed with the component
(``{"transformer.r": 4, "transformer.lora_alpha": 8, "transformer.alpha_pattern": {...}}``);
``load_lora_weights`` reads the alphas back from it, since the peft layout has no alpha
tensors. The trainer (network_weights) and every lora_tool command read it here, so a header
that is not such an object, or whose alpha fields are not finite numbers (or valid patterns),
gets one message everywhere: the file, the field and the fix.

A ``lora_alpha`` (or an ``alpha_pattern`` value) of 0 is read as kohya reads alpha 0: alpha =
rank, scale 1 (:meth:`PeftConfig.alpha`; :meth:`PeftConfig.zero_fields` names them).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from library.errors import CheckpointError

PEFT_METADATA = "lora_adapter_metadata"  # diffusers' LORA_ADAPTER_METADATA_KEY
_REWRITE = (
    f"write the {PEFT_METADATA} header again (diffusers' save_lora_weights writes it), or "
    "remove it to read every module at scale 1"
)


@dataclass(frozen=True)
class PeftConfig:
    """The alpha fields of one component's LoraConfig (``lora_alpha``: None when unset)."""

    lora_alpha: float | None = None
    alpha_pattern: tuple[tuple[re.Pattern, float], ...] = ()
    use_rslora: bool = False
    use_dora: bool = False
    zero_fields: tuple[str, ...] = field(default=())

    def alpha(self, path: str, rank: int) -> float:
        """The kohya alpha (scale alpha / rank) that gives module ``path`` of rank ``rank``
        peft's scale: its alpha_pattern value (matched as peft does, against the end of the
        path at a dot boundary), else lora_alpha, else rank; rsLoRA's lora_alpha / sqrt(r) as
        alpha * sqrt(r). 0 is alpha = rank (scale 1)."""
        value = next((v for p, v in self.alpha_pattern if p.fullmatch(path)), self.lora_alpha)
        if value is None or value == 0:
            return float(rank)
        return value * math.sqrt(rank) if self.use_rslora else value


def peft_configs(metadata: Mapping[str, str] | None, source) -> dict[str, PeftConfig]:
    """component -> :class:`PeftConfig` of a file's ``lora_adapter_metadata`` header (empty
    without one); CheckpointError naming ``source``, the field and the fix for a header that is
    not a JSON object, or whose lora_alpha / alpha_pattern / use_rslora / use_dora is not what
    peft writes."""
    raw = (metadata or {}).get(PEFT_METADATA)
    if raw is None:
        return {}
    where = f"{source}: its {PEFT_METADATA} header"
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"{where} is not JSON ({exc}); {_REWRITE}") from None
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{where} is a JSON {type(data).__name__}, not an object of LoraConfig fields "
            f'(such as {{"transformer.lora_alpha": 8}}); {_REWRITE}'
        )
    fields: dict[str, dict[str, object]] = {}
    for key, value in data.items():
        component, _, name = key.rpartition(".")
        fields.setdefault(component, {})[name] = value
    return {component: _config(values, component, where) for component, values in fields.items()}


def _config(values: Mapping[str, object], component: str, where: str) -> PeftConfig:
    def name(key: str) -> str:
        return f"{component}.{key}" if component else key

    zero = []
    alpha = values.get("lora_alpha")
    if alpha is not None:
        alpha = _number(alpha, name("lora_alpha"), where)
        if alpha == 0:
            zero.append(name("lora_alpha"))
    patterns = values.get("alpha_pattern") or {}
    if not isinstance(patterns, dict):
        raise CheckpointError(
            f"{where}: {name('alpha_pattern')} is {json.dumps(patterns)}, not an object of "
            f"module pattern -> alpha; {_REWRITE}"
        )
    compiled = []
    for pattern, value in patterns.items():
        label = f"{name('alpha_pattern')}[{pattern!r}]"
        number = _number(value, label, where)
        if number == 0:
            zero.append(label)
        try:
            compiled.append((re.compile(rf"(.*\.)?({pattern})"), number))
        except re.error as exc:
            raise CheckpointError(
                f"{where}: {label} is not a valid regular expression ({exc}); {_REWRITE}"
            ) from None
    flags = {key: _flag(values.get(key), name(key), where) for key in ("use_rslora", "use_dora")}
    return PeftConfig(alpha, tuple(compiled), zero_fields=tuple(zero), **flags)


def _number(value: object, label: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckpointError(f"{where}: {label} is {json.dumps(value)}, not a number; {_REWRITE}")
    if not math.isfinite(value):
        raise CheckpointError(f"{where}: {label} is {value}, not a finite number; {_REWRITE}")
    return float(value)


def _flag(value: object, label: str, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise CheckpointError(
            f"{where}: {label} is {json.dumps(value)}, not true or false; {_REWRITE}"
        )
    return value
