"""What an adapter kind (LoRA, LyCORIS, ...) answers: the interface every kind implements.

A kind is chosen by the run's ``network_module``, builds its settings from the config, names
itself in the plan, injects its layers into a model on the family's targets, lists its layers
and trained parameters, freezes them, counts the numbers a file stores, and turns ONE file
module's tensors into its layer's state and back. Files are composed elsewhere
(library/networks/adapter_files.py): a family's key map says which model layers a file module
stands for, the kind says what tensors that module holds. So no family knows a kind's tensors,
and a new kind is one class plus one line in library/networks/kinds.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from library.errors import CheckpointError


@dataclass(frozen=True)
class FileModule:
    """One module of an adapter file and the model layers it stands for.

    ``parts`` are the model's layer paths in the order of the file weight's output rows (one for
    a plain rename, several for an original model's fused layer); ``swapped_halves``: the file's
    rows are the parts' rows with their two halves exchanged (library.networks.fused_keys).
    library.networks.fused_keys.KohyaModule has these fields too and serves as one.
    """

    name: str
    parts: tuple[str, ...]
    swapped_halves: bool = False


@dataclass(frozen=True)
class AdapterSettings:
    """One run's adapter: its kind's name, kohya's LoRA ranks (``lora``, which the LoRA kind and
    block-wise ranks use), the kind's own settings (``spec``, e.g. a LycorisSpec) and its layer
    preset."""

    lora: object  # library.networks.lora.LoraSpec
    spec: object | None = None
    preset: str = "full"
    kind: str = "lora"


class AdapterKind:
    """One adapter kind. Subclasses set ``name`` and ``network_modules`` and implement the
    methods that raise NotImplementedError here; the file methods have per-module defaults."""

    name: str = ""
    # kohya network_module values that select this kind; the default kind takes every other one
    network_modules: tuple[str, ...] = ()
    # What LoRA+'s refusal calls this kind ("LyCORIS adapters"); None: LoRA+ applies
    loraplus_refusal: str | None = None

    # -- config and plan ---------------------------------------------------------------------

    def settings(self, config) -> AdapterSettings:
        """The run's settings from ``config``; ConfigError for values the kind refuses."""
        raise NotImplementedError(f"the {self.name} adapter does not read a config")

    def plan_name(self, config) -> str:
        """The adapter in a few words ("LoRA", "LyCORIS LoHa + DoRA")."""
        return self.name

    def plan_parts(self, config, where: str) -> list[str]:
        """The plan line's parts after the name, rank and alpha; ``where`` says which models
        train ("denoiser only", ...)."""
        return [where]

    def trains_text_encoders(self, settings: AdapterSettings) -> bool:
        """Whether the settings adapt text-encoder layers at all."""
        return True

    # -- the model ---------------------------------------------------------------------------

    def inject(self, family, module: nn.Module, role: str, settings: AdapterSettings) -> list[str]:
        """Freeze ``module`` and give the layers ``family`` targets for ``role`` fresh adapters
        of this kind (each the identity at first); their paths."""
        targets = family.adapter_targets(module, role, settings.lora.conv_dim is not None)
        return self.inject_targets(module, targets, settings)

    def inject_targets(
        self, model: nn.Module, targets: Mapping[str, str], settings: AdapterSettings
    ) -> list[str]:
        """Freeze ``model`` and adapt exactly ``targets`` (path -> "linear" | "conv")."""
        raise NotImplementedError(f"the {self.name} adapter cannot be injected")

    def layers(self, model: nn.Module) -> dict[str, nn.Module]:
        """Path -> adapter layer of this kind in ``model``, in module order."""
        raise NotImplementedError

    def layer_parameters(self, layer: nn.Module) -> list[nn.Parameter]:
        """The adapter parameters of one of its layers, in the order optimizers see them."""
        raise NotImplementedError

    def freeze(self, layer: nn.Module) -> None:
        """Stop training one adapter layer (it stays in the model and in files)."""
        for param in self.layer_parameters(layer):
            param.requires_grad_(False)

    def saved_numbers(self, model: nn.Module) -> int:
        """How many numbers a file stores for this kind's adapters of ``model``."""
        return sum(p.numel() for layer in self.layers(model).values() for p in
                   self.layer_parameters(layer))  # fmt: skip

    # -- files: one module at a time ---------------------------------------------------------

    def file_layers(self, model: nn.Module) -> dict[str, nn.Module]:
        """Model layer path -> the adapter that changes that layer's output, for every layer
        this kind adapts (what file modules' parts are looked up in)."""
        return self.layers(model)

    def module_layer(self, file_layers: Mapping[str, nn.Module], module: FileModule):
        """The adapter layer holding ``module``'s tensors, or None when this kind adapts none
        of its parts; ValueError when it adapts only some of them."""
        found = [file_layers.get(path) for path in module.parts]
        if all(layer is None for layer in found):
            return None
        if len(found) != 1 or module.swapped_halves:
            raise ValueError(
                f"{module.name} stands for {', '.join(module.parts)} as one layer; the "
                f"{self.name} adapter adapts layers one by one"
            )
        return found[0]

    def module_tensors(
        self, file_layers: Mapping[str, nn.Module], module: FileModule
    ) -> dict[str, torch.Tensor] | None:
        """{suffix: tensor} the file stores under ``module.name``, or None when this kind does
        not adapt its layers."""
        layer = self.module_layer(file_layers, module)
        return None if layer is None else self.export_layer(layer)

    def export_layer(self, layer: nn.Module) -> dict[str, torch.Tensor]:
        """{suffix: tensor} of one adapter layer (detached copies)."""
        raise NotImplementedError

    def group_tensors(
        self, tensors: Mapping[str, torch.Tensor], source: str
    ) -> dict[str, dict[str, torch.Tensor]]:
        """File module name -> {suffix: tensor} (``<name>.<suffix>`` keys; the name has no dot)."""
        groups: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            name, _, suffix = key.partition(".")
            groups.setdefault(name, {})[suffix] = tensor
        return groups

    def check_layer(self, layer: nn.Module, tensors: Mapping[str, torch.Tensor], where: str):
        """CheckpointError (naming ``where`` and the key) when ``tensors`` do not fit ``layer``."""
        raise NotImplementedError

    def load_layer(self, layer: nn.Module, tensors: Mapping[str, torch.Tensor], where: str):
        """Copy checked ``tensors`` into ``layer``."""
        raise NotImplementedError

    def load_modules(
        self,
        layers: Mapping[str, nn.Module],
        groups: Mapping[str, Mapping[str, torch.Tensor]],
        source: str,
    ) -> None:
        """Load each file module's tensors into its layer (``layers``: file module name ->
        adapter layer, the same names as ``groups``): all are checked before any is loaded,
        so a refused file leaves the adapters as they were."""
        for name in sorted(groups):
            self.check_layer(layers[name], groups[name], f"{source}: {name}")
        for name in sorted(groups):
            self.load_layer(layers[name], groups[name], f"{source}: {name}")

    def load_original_modules(
        self, model: nn.Module, modules: list, tensors: Mapping[str, torch.Tensor], source: str
    ) -> None:
        """Load a file whose modules name an original model's (possibly fused) layers
        (``modules``: the key map's entries this kind adapts in ``model``)."""
        file_layers = self.file_layers(model)
        layers = {m.name: self.module_layer(file_layers, m) for m in modules}
        groups = self.group_tensors(tensors, source)
        unknown = sorted(set(groups) - set(layers))
        if unknown:
            raise CheckpointError(
                f"{source}: {len(unknown)} modules in the file are not {self.name} modules of "
                f"this model and settings, e.g. {unknown[0]}"
            )
        missing = sorted(set(layers) - set(groups))
        if missing:
            raise CheckpointError(f"{source}: lacks {len(missing)} modules, e.g. {missing[0]}")
        self.load_modules(layers, groups, source)
