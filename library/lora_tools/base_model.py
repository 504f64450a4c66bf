"""The base model of a toolbox command, and the layers a LoRA/LyCORIS file may name in it.

Loading goes through the trainer's own loaders: the command's options become a config
[model] section (ModelSection) and a [flow] section (FlowSection: FLUX.1's and SD3's separate
clip_l, clip_g, t5xxl and ae files), and library.models.loader.load_components picks the family
that claims the path. So every model the trainer loads (a diffusers folder or a single
.safetensors checkpoint of SD 1.x/2.x, SDXL, FLUX.1 or SD3/SD3.5) works here, with the same
one-line errors.

:func:`layer_table` lists, for a loaded model, every layer a file may name, under kohya's name
for that family (library/networks/kohya_keys.py): each Linear and Conv2d of the UNet or
transformer and of the text encoders. FLUX.1's and SD3's transformer layers are named after the
original model, where one weight may be several diffusers Linears (q, k, v fused) or keep its
rows in another order (a modulation's shift and scale halves swapped): a :class:`Layer` records
its diffusers parts in the order of the original weight's rows. Which Linears form one original
weight is read off the family's own state-dict converter (``transformer_to_original``), so the
table and the single-file writers can never disagree.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError, ModelError
from library.lora_tools.common import DTYPES
from library.models.families.family_entry import FamilyEntry
from library.models.families.registry import (
    FAMILIES,
    claim_order,
    entry_of,
    families,
    trained_lines,
    unet_key_layout,
)
from library.models.loader import load_components
from library.networks.kohya_names import UNET, kohya_name, kohya_path, unwrap
from library.networks.lora_file_checks import model_line, version_line

DENOISER = -1  # Layer.component of the UNet / transformer; text encoders are 0, 1, 2
# The [model] keys of every model: a replacement VAE, the tokenizer folders of single files.
_MODEL_OPTIONS = {
    "vae": "use this VAE instead of the model's (a file or diffusers VAE folder)",
    "tokenizer_path": "single-file model: a folder with the CLIP tokenizer (vocab.json + "
    "merges.txt), or with tokenizer/ and tokenizer_2/",
}


def _family_options() -> dict[str, str]:
    """The component files a registered family's single files may need ([flow] keys, in the
    section's order) -> help naming the families."""
    owners: dict[str, list[FamilyEntry]] = {}
    for entry in FAMILIES:
        for key in entry.tool.component_options:
            owners.setdefault(key, []).append(entry)
    return {
        key: f"{' or '.join(e.models for e in owners[key])} single file: "
        + owners[key][0].tool.component_options[key]
        for key in sorted(owners, key=list(FlowSection.model_fields).index)
    }


_FLOW_OPTIONS = _family_options()
COMPONENT_OPTIONS = {**_FLOW_OPTIONS, **_MODEL_OPTIONS}


# -- loading -----------------------------------------------------------------------------------


def add_model_arguments(
    parser: argparse.ArgumentParser, flags: Mapping[str, str], precision: bool = True
) -> None:
    """One required path option per entry of ``flags`` (flag -> help), the component files of
    single-file models (shared by every model the command loads) and --precision."""
    for flag, text in flags.items():
        parser.add_argument(
            flag,
            required=True,
            metavar="PATH",
            help=f"{text}: a diffusers model folder or a single .safetensors checkpoint of "
            f"{trained_lines('or')} (anything the trainer loads; nothing is downloaded)",
        )
    with_files = " or ".join(e.models for e in FAMILIES if e.tool.component_options)
    group = parser.add_argument_group(
        f"model component files (single-file {with_files} models, as in the training config)"
    )
    for key, text in COMPONENT_OPTIONS.items():
        group.add_argument(f"--{key}", metavar="PATH", default=None, help=text)
    if precision:
        parser.add_argument(
            "--precision",
            choices=sorted(DTYPES),
            default="fp32",
            help="dtype the model weights are loaded in (default fp32; bf16 halves the memory "
            "of large models, the arithmetic is float32 either way)",
        )


def model_inputs(args: argparse.Namespace, models: Mapping[str, str]) -> list[tuple[str, str]]:
    """(option, path) of the models a command reads (``models``: option -> path) and of the
    component files and tokenizer folders given with them: what its output must not touch."""
    components = [(f"--{key}", getattr(args, key, None)) for key in COMPONENT_OPTIONS]
    return [*models.items(), *((flag, path) for flag, path in components if path)]


def load_model(args: argparse.Namespace, path: str, flag: str = "--model"):
    """The model at ``path`` with the component options of ``args``, loaded by the trainer's
    loaders (library.models.loader.load_components): Components, every module frozen on the
    CPU in --precision. ModelError naming ``flag`` for a path that is not there; the loaders'
    own one-line errors otherwise."""
    if not path or not Path(path).expanduser().exists():
        raise ModelError(
            f"{flag} {path}: not found; give a diffusers model folder or a .safetensors checkpoint"
        )
    for key in COMPONENT_OPTIONS:
        value = getattr(args, key, None)
        if value is not None and not Path(value).expanduser().exists():
            raise ModelError(f"--{key} {value}: not found")
    dtype = DTYPES[getattr(args, "precision", None) or "fp32"]
    try:
        model = ModelSection(
            pretrained_model_name_or_path=str(path),
            **{key: getattr(args, key, None) for key in _MODEL_OPTIONS},
        )
        flow = FlowSection(**{key: getattr(args, key, None) for key in _FLOW_OPTIONS})
    except ValueError as exc:  # pydantic's ValidationError
        raise ConfigError(f"{flag} {path}: {exc}") from None
    try:
        return load_components(model, dtype, flow)
    except ModelError as exc:
        raise ModelError(f"{flag} {path}: {_as_options(str(exc), flag)}") from None


def _as_options(message: str, flag: str) -> str:
    """A loader message in this command's terms: config keys become its options."""
    import re

    message = message.replace("pretrained_model_name_or_path", flag)
    # 'set clip_l = "<path>" in [flow]' -> 'give --clip_l "<path>"'
    message = re.sub(
        r"set (\w+) = (\"[^\"]*\"|\S+) in \[(?:flow|model)\]", r"give --\1 \2", message
    )
    for key in COMPONENT_OPTIONS:
        message = re.sub(rf"\b{key} = ", f"--{key} ", message)
    return message


def family_label(family) -> str:
    """The family in words for messages: "SD 1.x", "SDXL", "FLUX.1 dev", "SD3.5 Medium", ..."""
    for entry in families():
        if family.name in entry.tool.variant_labels:
            return entry.tool.variant_labels[family.name]
    return family.name


def family_group(family) -> str:
    """The model line of a loaded family ("SD 1.x/2.x", "SDXL", "FLUX.1", ...): what
    ``guess_family`` can tell apart."""
    return model_line(family)


def guess_family(names: Iterable[str], metadata: Mapping[str, str] | None = None) -> str | None:
    """The model line (``family_group``) a LoRA file was made for, from its
    ss_base_model_version or its kohya module names; None when neither tells."""
    version = version_line(metadata)
    if version is not None:
        return version
    # In the order they decide: the transformers' names over the text encoders' (FLUX.1 files
    # hold lora_te1_ too), SDXL's over SD 1.x/2.x's.
    marks = [mark for entry in claim_order() for mark in entry.tool.lora_marks]
    found = {next((line for mark, line in marks if name.startswith(mark)), None) for name in names}
    return next((line for _, line in marks if line in found), None)


def other_family(names: Iterable[str], metadata: Mapping[str, str] | None, family) -> str | None:
    """The model line a LoRA file was made for (``guess_family``) when it is not ``family``'s;
    None when it is, or when nothing tells."""
    guess = guess_family(names, metadata)
    return guess if guess is not None and guess != family_group(family) else None


# -- the layers a file may name ----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Layer:
    """One module a LoRA/LyCORIS file may name, and the layer(s) of the loaded model it means.

    ``name`` is kohya's (``lora_unet_...``, ``lora_te1_...``), ``prefix`` its prefix,
    ``original`` the path kohya names (the name without the prefix, with dots),
    ``component`` DENOISER or the text encoder's index, ``model`` that module, ``parts`` the
    module paths in ``model`` whose weights, stacked by rows in this order, are the weight the
    name stands for; ``swapped_halves``: that weight's two halves of rows are exchanged first
    (the original model keeps (shift, scale) where diffusers keeps (scale, shift)).
    """

    name: str
    prefix: str
    original: str
    component: int
    model: nn.Module
    parts: tuple[str, ...]
    swapped_halves: bool = False

    @property
    def fused(self) -> bool:
        return len(self.parts) > 1

    @property
    def modules(self) -> list[nn.Module]:
        """The layers (Linear / Conv2d) of ``parts``."""
        return [_base_layer(self.model.get_submodule(path)) for path in self.parts]

    @property
    def rows(self) -> tuple[int, ...]:
        """Output rows of each part."""
        return tuple(int(module.weight.shape[0]) for module in self.modules)

    @property
    def shape(self) -> torch.Size:
        """The shape of the weight the name stands for ([sum of rows, in, ...])."""
        first = self.modules[0].weight.shape
        return torch.Size((sum(self.rows), *first[1:]))

    @property
    def weight(self) -> torch.Tensor:
        """That weight: the layer's own tensor for a plain layer, a new stacked tensor (in the
        original row order) for a fused or swapped one."""
        weights = [module.weight for module in self.modules]
        if len(weights) == 1 and not self.swapped_halves:
            return weights[0]
        return self.join([w.detach() for w in weights])

    def join(self, per_part: list[torch.Tensor]) -> torch.Tensor:
        """Per-part tensors (rows of each part, diffusers order) -> the name's weight layout."""
        stacked = torch.cat(per_part, dim=0) if len(per_part) > 1 else per_part[0]
        return _swap_halves(stacked) if self.swapped_halves else stacked

    def split(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """A tensor in the name's row layout -> one tensor per part (diffusers' row order)."""
        if self.swapped_halves:
            tensor = _swap_halves(tensor)
        return list(tensor.split(self.rows, dim=0))

    @torch.no_grad()
    def set_weight(self, value: torch.Tensor) -> None:
        """Write ``value`` (the name's layout) into the parts' weights, in their dtype."""
        for module, piece in zip(self.modules, self.split(value), strict=True):
            module.weight.copy_(piece.to(module.weight.device, module.weight.dtype))


def _swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    half = tensor.shape[0] // 2
    return torch.cat([tensor[half:], tensor[:half]], dim=0)


def _base_layer(module: nn.Module) -> nn.Module:
    """A layer wrapped by a peft adapter is its ``base_layer``."""
    return getattr(module, "base_layer", module)


def _weight_layers(model: nn.Module) -> list[str]:
    """Paths of the Linear and Conv2d layers of ``model`` (a peft wrapper counts as its base
    layer; the adapter's own layers inside it do not)."""
    found: list[str] = []
    for path, module in model.named_modules():
        if not path or any(path.startswith(f"{outer}.") for outer in found):
            continue
        if isinstance(_base_layer(module), (nn.Linear, nn.Conv2d)):
            found.append(path)
    return found


def layer_table(components) -> dict[str, Layer]:
    """kohya module name -> Layer for every layer a LoRA/LyCORIS file may name in the loaded
    model (``components``: library.models.components.Components): every Linear and Conv2d of the
    denoiser and of each text encoder, named as kohya names it for the family."""
    family = components.family
    table: dict[str, Layer] = {}
    denoiser = unwrap(components.denoiser)
    for original, parts, swapped in _denoiser_layers(denoiser, entry_of(family).tool.to_original):
        name = kohya_name(UNET, original)
        table[name] = Layer(name, UNET, original, DENOISER, denoiser, parts, swapped)
    prefixes = family.text_encoder_lora_prefixes
    for index, (prefix, encoder) in enumerate(zip(prefixes, components.text_encoders, strict=True)):
        encoder = unwrap(encoder)
        for path in _weight_layers(encoder):
            original = kohya_path(encoder, path)
            name = kohya_name(prefix, original)
            table[name] = Layer(name, prefix, original, index, encoder, (path,))
    return table


def _denoiser_layers(denoiser: nn.Module, to_original) -> list[tuple[str, tuple[str, ...], bool]]:
    """(kohya path, diffusers parts, swapped halves) of every weight layer of the denoiser;
    ``to_original``: the family's converter to the original model's names (None: a UNet)."""
    paths = _weight_layers(denoiser)
    if to_original is None:  # a UNet: one layer per name (SDXL's in SGM's names)
        return [(kohya_path(denoiser, path, unet_key_layout), (path,), False) for path in paths]
    # Label each layer's weight with two numbers (2i, 2i + 1); the converter stacks and swaps
    # them as it would the weights, which shows the parts and the order of every original one.
    labels = {f"{path}.weight": torch.tensor([2 * i, 2 * i + 1]) for i, path in enumerate(paths)}
    layers = []
    for key, value in to_original(labels).items():
        ids = value.tolist()
        swapped = ids[0] % 2 == 1
        if swapped:
            ids = _swap_halves(value).tolist()
        if any(ids[j] % 2 or ids[j + 1] != ids[j] + 1 for j in range(0, len(ids), 2)):
            raise ValueError(f"cannot tell the diffusers parts of {key}")
        parts = tuple(paths[ids[j] // 2] for j in range(0, len(ids), 2))
        layers.append((key.removesuffix(".weight"), parts, swapped))
    return layers


def default_layers(components, conv: bool) -> dict[str, Layer]:
    """The layers a default difftune LoRA adapts (with LoCon's 3x3 convs when ``conv``), by kohya
    name: the family's adapter targets of the denoiser and of every text encoder that trains by
    default (not FLUX.1's or SD3's T5-XXL)."""
    family = components.family
    targets: dict[int, set[str]] = {
        DENOISER: set(family.adapter_targets(components.denoiser, "unet", conv))
    }
    for index, encoder in enumerate(components.text_encoders):
        if family.trains_text_encoder(index):
            targets[index] = set(family.adapter_targets(encoder, "text_encoder", conv))
    chosen = {}
    for name, layer in layer_table(components).items():
        wanted = targets.get(layer.component, set())
        if wanted and all(path in wanted for path in layer.parts):
            chosen[name] = layer
    return chosen


def component_label(components, index: int) -> str:
    """ "UNet"/"transformer" or the text encoder's name ("CLIP-L", "T5-XXL", ...)."""
    family = components.family
    if index == DENOISER:
        return "UNet" if family.denoiser_subfolder == "unet" else "transformer"
    encoder = components.text_encoders[index]
    kind = type(encoder).__name__
    if kind.startswith("T5"):
        return "T5-XXL"
    count = sum(1 for e in components.text_encoders if type(e).__name__.startswith("CLIP"))
    if count == 1:
        return "text encoder" if family.denoiser_subfolder == "unet" else "CLIP-L"
    return ("CLIP-L", "CLIP-G")[index] if index < 2 else f"text encoder {index + 1}"
