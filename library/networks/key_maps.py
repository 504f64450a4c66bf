"""Key maps: how a family's adapter files name its models' layers, whatever the adapter kind.

A family picks one (``ModelFamily.adapter_key_map``); the map lists the file modules of each
model (kohya prefix -> adapted model) and the kinds (library/networks/kinds.py) give each
module's tensors, so writing and reading a file is the same code for every kind:

- :class:`KohyaNames`: kohya's one-to-one names for every model (``lora_unet_<path>``,
  ``lora_te1_<path>``; SD 1.x/2.x and SDXL, whose UNet paths library/networks/kohya_keys.py
  renames to the original layout).
- :class:`OriginalNames`: the text encoders as above, the denoiser in its original model's
  module names, some of which stand for several diffusers layers (FLUX.1's and SD3's fused
  qkv; library/networks/fused_keys.py). A file may leave some of those modules out.
- :class:`PathNames`: the denoiser alone, each layer as a fixed prefix plus its module path
  (Z-Image's and Qwen-Image's ``diffusion_model.<path>``); :class:`AliasedPathNames` writes
  each layer under the name its ``LinearNames`` writes (library/networks/path_names.py: the
  diffusers path, or the original model's) and reads those files in every other tool's names
  too; with ``folds_alpha`` a LoRA is written in peft's tensors, alpha folded in (Krea 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from library.errors import ConfigError
from library.networks import kohya_keys, kohya_names
from library.networks.kind_base import FileModule
from library.networks.kinds import kind_in
from library.networks.linear_files import LinearNames, fold_into_peft, load_file_tensors
from library.networks.module_files import adapted_modules, adapted_paths, write_modules


class KeyMap:
    """Names of one family's adapter file modules."""

    def modules(self, prefix: str, model: nn.Module) -> list[FileModule]:
        """The file modules of ``model`` (unwrapped; ``prefix`` its kohya prefix) that may hold
        its adapters (the writer keeps those whose layers carry one)."""
        raise NotImplementedError

    def write(self, models: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
        """The file tensors of the adapters of ``models`` (kohya prefix -> model)."""
        tensors: dict[str, torch.Tensor] = {}
        for prefix, model in models.items():
            model = kohya_names.unwrap(model)
            tensors.update(write_modules(model, self.modules(prefix, model)))
        return tensors

    # whether it reads diffusers' peft files (lora_A / lora_B keys) as well as kohya's
    reads_peft = False

    def read(
        self,
        models: Mapping[str, nn.Module],
        tensors: Mapping[str, torch.Tensor],
        source: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Load a file's tensors into the adapters of ``models``; CheckpointError naming
        ``source`` for a file that does not fit them (nothing is loaded then). ``metadata``:
        the file's header, where a layout keeps something the tensors do not (peft's alpha)."""
        raise NotImplementedError(f"{type(self).__name__} reads no files")


@dataclass(frozen=True)
class KohyaNames(KeyMap):
    """kohya's one-to-one names; ``text_prefixes`` are the family's text-encoder prefixes
    (which tell a file of another family from one whose text encoder does not train), and
    ``unet_key_layout`` the family's layout of a UNet's names (kohya_names.kohya_path)."""

    text_prefixes: tuple[str, ...] | None = None
    unet_key_layout: kohya_names.UNetKeyLayout | None = None

    def modules(self, prefix, model):
        return kohya_keys.plain_modules(prefix, model, self.unet_key_layout)

    def read(self, models, tensors, source, metadata=None):
        kohya_keys.import_lora(models, tensors, source, self.unet_key_layout)


@dataclass(frozen=True)
class OriginalNames(KeyMap):
    """Text encoders by :class:`KohyaNames`; the denoiser (``denoiser_prefix``, with its
    underscore) by ``denoiser_modules(model)``, every module its original model has."""

    text_prefixes: tuple[str, ...]
    denoiser_prefix: str
    denoiser_modules: Callable[[nn.Module], list]

    def modules(self, prefix, model):
        if prefix.rstrip("_") == kohya_names.UNET:
            return self.denoiser_modules(model)
        return kohya_keys.plain_modules(prefix, model)

    def read(self, models, tensors, source, metadata=None):
        denoiser = {k: v for k, v in tensors.items() if k.startswith(self.denoiser_prefix)}
        text = {k: v for k, v in tensors.items() if k not in denoiser}
        text_models = {p: m for p, m in models.items() if p != kohya_names.UNET}
        if text or text_models:
            kohya_keys.import_lora(text_models, text, source)
        if kohya_names.UNET in models:
            model = kohya_names.unwrap(models[kohya_names.UNET])
            modules = adapted_modules(model, self.denoiser_modules(model))
            kind_in([model]).load_original_modules(model, modules, denoiser, source)
        elif denoiser:
            raise ConfigError(
                f"network_weights: {source} holds transformer adapters and this run trains "
                "only the text encoders; remove network_train_text_encoder_only"
            )


@dataclass(frozen=True)
class PathNames(KeyMap):
    """The denoiser's layers as ``prefix`` + module path, sorted by path."""

    prefix: str

    def modules(self, prefix, model):
        return [FileModule(self.prefix + path, (path,)) for path in sorted(adapted_paths(model))]


@dataclass(frozen=True)
class AliasedPathNames(PathNames):
    """Each layer written as ``names.written(path)``, sorted by path; read under every name
    ``names`` lists for a Linear (other tools' layouts, library/networks/linear_files.py), per
    adapter kind. ``folds_alpha``: a LoRA is written in peft's tensor names with alpha / r
    folded into lora_B, for a family whose readers take no alpha there (diffusers' converters
    of original names, ComfyUI); LyCORIS modules keep their kind's tensors."""

    names: LinearNames
    folds_alpha: bool = False
    reads_peft = True

    def modules(self, prefix, model):
        paths = sorted(adapted_paths(model))
        return [FileModule(self.names.written(path), (path,)) for path in paths]

    def write(self, models):
        tensors = super().write(models)
        return fold_into_peft(tensors) if self.folds_alpha else tensors

    def read(self, models, tensors, source, metadata=None):
        model = kohya_names.unwrap(models[kohya_names.UNET])
        load_file_tensors(kind_in([model]), model, tensors, self.names, source, metadata)


def text_prefixes(key_map: KeyMap) -> tuple[str, ...] | None:
    """The family's kohya text-encoder prefixes where its files name text encoders kohya's way
    (a file with another prefix is another family's: lora_file_checks.check_text_prefixes);
    None for a key map that names none so."""
    return key_map.text_prefixes if isinstance(key_map, (KohyaNames, OriginalNames)) else None
