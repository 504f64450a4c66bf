"""The key map of Qwen-Image adapter files: ``diffusion_model.<diffusers path>``.

ComfyUI's Qwen-Image model keeps diffusers' module names (its checkpoint is
``model.diffusion_model.`` + the diffusers names), and its LoRA loader maps
``diffusion_model.<path>`` to them; diffusers' QwenImageLoraLoaderMixin reads the same files
(it drops the prefix and turns kohya's tensors into its own).
musubi-tuner's ``convert_lora.py --target other`` writes these names too. So a file holds
``diffusion_model.<path>`` + kohya's LoRA tensors per Linear (a LyCORIS file its kind's tensors
under the same module names). Files are read back under the
same names.
"""

from __future__ import annotations

from dataclasses import dataclass

from library.errors import CheckpointError
from library.networks.key_maps import PathNames
from library.networks.kinds import kind_in
from library.networks.kohya_names import UNET, unwrap

PREFIX = "diffusion_model."


@dataclass(frozen=True)
class QwenImageNames(PathNames):
    """``diffusion_model.<path>`` modules, written and read: each file key is its module's name
    and the adapter kind's tensor name; the kind checks and loads each module's tensors."""

    prefix: str = PREFIX

    def read(self, models, tensors, source):
        model = unwrap(models[UNET])
        kind = kind_in([model])
        layers = {PREFIX + path: layer for path, layer in kind.layers(model).items()}
        names = sorted(layers, key=len, reverse=True)
        groups: dict[str, dict] = {}
        for key, tensor in tensors.items():
            name = next((n for n in names if key.startswith(n + ".")), None)
            if name is None:
                raise CheckpointError(
                    f"{source}: {key!r} names no {kind.name} module of this Qwen-Image "
                    f"transformer and settings (modules are named like "
                    f"{PREFIX}transformer_blocks.0.attn.to_q); check network_args preset"
                )
            groups.setdefault(name, {})[key[len(name) + 1 :]] = tensor
        missing = sorted(set(layers) - set(groups))
        if missing:
            raise CheckpointError(f"{source}: lacks {len(missing)} modules, e.g. {missing[0]}")
        kind.load_modules(layers, groups, source)


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
