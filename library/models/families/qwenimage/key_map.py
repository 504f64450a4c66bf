"""The key map of Qwen-Image adapter files: ``diffusion_model.<diffusers path>``.

ComfyUI's Qwen-Image model keeps diffusers' module names (its checkpoint is
``model.diffusion_model.`` + the diffusers names), and its LoRA loader maps
``diffusion_model.<path>`` to them; diffusers' QwenImageLoraLoaderMixin reads the same files
(it drops the prefix and turns kohya's lora_down / lora_up / alpha into its lora_A / lora_B).
musubi-tuner's ``convert_lora.py --target other`` writes these names too. So a file holds
``diffusion_model.<path>.lora_down.weight``, ``.lora_up.weight`` and ``.alpha`` per Linear (a
LyCORIS file its kind's tensors under the same module names). Files are read back under the
same names; a module without alpha has alpha = rank (scale 1), as every reader of such files
assumes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from library.errors import CheckpointError
from library.networks.fused_keys import load_adapter_weights
from library.networks.key_maps import PathNames
from library.networks.kinds import kind_in
from library.networks.kohya_names import UNET, unwrap
from library.networks.lycoris.file_math import LOCON_KEYS, LOHA_KEYS, LOKR_KEYS, SHARED_KEYS

PREFIX = "diffusion_model."
_LORA = {"lora_down.weight": "down", "lora_up.weight": "up", "alpha": "alpha"}
_LYCORIS = LOCON_KEYS + LOHA_KEYS + LOKR_KEYS + SHARED_KEYS


@dataclass(frozen=True)
class QwenImageNames(PathNames):
    """``diffusion_model.<path>`` modules, written and read."""

    prefix: str = PREFIX

    def read(self, models, tensors, source):
        transformer = unwrap(models[UNET])
        kind = kind_in([transformer])
        if kind.name == "lora":
            groups = _modules(tensors, transformer, tuple(_LORA), source)
            load_adapter_weights(transformer, _lora_weights(groups, source), source)
        elif kind.name == "lycoris":
            groups = _modules(tensors, transformer, _LYCORIS, source)
            layers = kind.layers(transformer)
            if set(groups) != set(layers):
                extra = sorted(set(groups) ^ set(layers))
                raise CheckpointError(
                    f"{source}: its LyCORIS modules are not this preset's ({extra[0]} is in one "
                    "only); check network_args preset"
                )
            kind.load_modules(layers, groups, source)
        else:
            raise CheckpointError(f"{source}: Qwen-Image files hold no {kind.name} adapters")


def _modules(
    tensors: Mapping[str, torch.Tensor], transformer, suffixes: tuple[str, ...], source: str
) -> dict[str, dict[str, torch.Tensor]]:
    """{Linear path: {suffix: tensor}} of the file; CheckpointError naming the key for a tensor
    of another kind or a module that is no Linear of the transformer."""
    linears = {p for p, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    linears |= {p.removesuffix(".base_layer") for p in linears}
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        suffix = next((s for s in sorted(suffixes, key=len, reverse=True)
                       if key.endswith("." + s)), None)  # fmt: skip
        if suffix is None or not key.startswith(PREFIX):
            raise CheckpointError(
                f"{source}: {key!r} is no adapter tensor of a Qwen-Image file (its names are "
                f"{PREFIX}<module path>.<{' | '.join(suffixes[:3])} ...>)"
            )
        path = key[len(PREFIX) : -len(suffix) - 1]
        if path not in linears:
            raise CheckpointError(
                f"{source}: {key!r} names {path!r}, which is no Linear of the Qwen-Image "
                f"transformer (modules are named like {PREFIX}transformer_blocks.0.attn.to_q)"
            )
        groups.setdefault(path, {})[suffix] = tensor
    return groups


def _lora_weights(groups, source):
    weights = {}
    for path, parts in sorted(groups.items()):
        named = {_LORA[s]: t for s, t in parts.items()}
        if "down" not in named or "up" not in named:
            raise CheckpointError(f"{source}: {PREFIX}{path} lacks its lora_down or lora_up")
        down, up = named["down"], named["up"]
        alpha = named.get("alpha")
        weights[path] = (down, up, float(down.shape[0] if alpha is None else alpha.float().item()))
    return weights


def comfy_model_name(layer) -> str:
    """The weight of ComfyUI's own Qwen-Image model a Linear of the toolbox's layer table is
    (``layer.parts``: its one diffusers path): ComfyUI keeps diffusers' module names."""
    (path,) = layer.parts
    return path


def comfy_keys(layer, original: str) -> dict[str, tuple[int, ...] | None]:
    """The further names ComfyUI's loader gives a Linear of its Qwen-Image model (comfy/lora.py,
    its Qwen-Image branch): the diffusers path under ``diffusion_model.``, ``transformer.``,
    ``lycoris_`` (underscored) and bare."""
    (path,) = layer.parts
    names = (PREFIX + path, "transformer." + path, "lycoris_" + path.replace(".", "_"), path)
    return dict.fromkeys(names)
