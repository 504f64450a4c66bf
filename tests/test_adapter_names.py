"""Model families do not know adapter kinds' file tensors: the modules that still do may only
get fewer.

A family gives key maps (library/networks/key_maps.py: which file module stands for which of
its layers); what tensors a module holds is its adapter kind's (library/networks/kinds.py). So
no module under library/models/families/ may name kohya's LoRA tensors (``lora_down``,
``lora_up``), peft's (``lora_A``, ``lora_B``) or LyCORIS' (``hada_w1_a``, ``lokr_w1``,
``dora_scale``, ... and the lists of them in library/networks/lycoris/file_math.py), in code,
strings or prose alike.

ALLOWED lists the family modules that still do, each with why; a listed module that no longer
names one fails too, so that it leaves the list.
"""

from __future__ import annotations

import re
from pathlib import Path

from library.networks.lycoris import file_math

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ROOT / "library" / "models" / "families"

_TENSORS = {*file_math.LOCON_KEYS, *file_math.LOHA_KEYS, *file_math.LOKR_KEYS, "dora_scale"}
_STEMS = sorted({name.removesuffix(".weight") for name in _TENSORS} | {"lora_A", "lora_B"})
_LISTS = ("LOCON_KEYS", "LOHA_KEYS", "LOKR_KEYS", "SHARED_KEYS", "ALGO_KEYS")
ADAPTER_NAME = re.compile(r"(?<![A-Za-z0-9])(" + "|".join([*_STEMS, *_LISTS]) + r")(?![A-Za-z0-9])")

ALLOWED = {
    "library/models/families/sd3/lora_keys.py": 'lora_format = "diffusers": SD3\'s peft '
    "layout (lora_A/lora_B with alpha / r folded into lora_B), written and read here",
}


def _naming() -> dict[str, str]:
    found = {}
    for path in sorted(FAMILIES.rglob("*.py")):
        match = ADAPTER_NAME.search(path.read_text(encoding="utf-8"))
        if match:
            found[path.relative_to(ROOT).as_posix()] = match.group(0)
    return found


def test_the_pattern_finds_adapter_tensor_names():
    for text in ("x.lora_down.weight", '"hada_w1_a"', "dora_scale", "LOHA_KEYS", "lora_B"):
        assert ADAPTER_NAME.search(text), text
    for text in ("lora_downsample", "my_lora_up2", "lora_unet_", "lycoris_modules"):
        assert not ADAPTER_NAME.search(text), text


def test_families_do_not_name_adapter_tensors():
    naming = _naming()
    unexpected = {path: word for path, word in naming.items() if path not in ALLOWED}
    assert not unexpected, (
        f"family modules name an adapter kind's file tensors: {unexpected}; give the family a "
        "key map (library/networks/key_maps.py) and leave the tensors to the kind"
    )


def test_the_allowlist_only_shrinks():
    naming = _naming()
    stale = sorted(path for path in ALLOWED if path not in naming)
    assert not stale, f"no longer name adapter tensors, remove them from ALLOWED: {stale}"
