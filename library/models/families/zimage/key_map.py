"""The key map of Z-Image adapter files: written as ``diffusion_model.<diffusers path>``
(library.networks.key_maps.PathNames), read under every name lora_keys.py lists.

Reading other tools' layouts (aliases, a fused qkv, alphas a peft header gives) is still per
adapter kind here: lora_file.py reads LoRA files, lycoris_file.py LyCORIS ones, and the kind
loads what they give.
"""

from __future__ import annotations

from dataclasses import dataclass

from library.errors import CheckpointError
from library.models.families.zimage import lora_keys
from library.models.families.zimage.lora_file import read_lora
from library.models.families.zimage.lycoris_file import read_lycoris
from library.networks.fused_keys import load_adapter_weights
from library.networks.key_maps import PathNames
from library.networks.kinds import kind_in
from library.networks.kohya_names import UNET, unwrap


@dataclass(frozen=True)
class ZImageNames(PathNames):
    """``diffusion_model.<path>`` modules, read through the kind's reader of other layouts."""

    prefix: str = lora_keys.PREFIX

    def read(self, models, tensors, source):
        plain = unwrap(models[UNET])
        kind = kind_in([plain])
        reader = _READERS.get(kind.name)
        if reader is None:
            raise CheckpointError(f"{source}: Z-Image files hold no {kind.name} adapters")
        reader(kind, plain, tensors, source)


def _read_lora(kind, transformer, tensors, source) -> None:

    load_adapter_weights(transformer, read_lora(tensors, transformer, source=source), source)


def _read_lycoris(kind, transformer, tensors, source) -> None:

    layers = kind.layers(transformer)
    modules = read_lycoris(tensors, transformer, source)
    if set(modules) != set(layers):
        extra = sorted(set(modules) ^ set(layers))
        raise CheckpointError(
            f"{source}: its LyCORIS modules are not this preset's ({extra[0]} is in one "
            "only); check network_args preset"
        )
    kind.load_modules(layers, modules, source)


# kind name -> the reader of that kind's Z-Image files (other tools' layouts included)
_READERS = {"lora": _read_lora, "lycoris": _read_lycoris}
