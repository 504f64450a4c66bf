"""The three key layouts of a LoRA file, how to tell which one a file is in, and what a model's
layers are called in each (docs: the toolbox's convert section):

- kohya (sd-scripts, A1111/Forge, difftune's own files): ``<kohya name>.lora_down.weight`` /
  ``.lora_up.weight`` / ``.alpha``, names from library/networks/kohya_keys.py (SDXL's UNet in
  SGM's names, FLUX.1's and SD3's transformer in the original model's, fused q/k/v as one module).
- diffusers / peft (``pipe.load_lora_weights``, ``pipe.save_lora_weights``):
  ``<component>.<diffusers module path>.lora_A.weight`` (= lora_down) / ``.lora_B.weight``
  (= lora_up), components ``unet`` or ``transformer`` and the pipeline's ``text_encoder`` /
  ``text_encoder_2`` (CLIP paths with ``text_model.``), one entry per diffusers Linear (a fused
  kohya module becomes its parts). The layout has no alpha tensors: diffusers and peft keep
  ``lora_alpha`` (per module: ``alpha_pattern``) in the adapter config, which diffusers'
  ``save_lora_weights`` writes as the JSON header entry ``lora_adapter_metadata`` (keys
  ``<component>.r``, ``.lora_alpha``, ...) and ``load_lora_weights`` reads back. Without it a
  module's scale is 1. ``--fold_alpha`` multiplies ``alpha / r`` into lora_B instead, for
  readers that ignore the header (ComfyUI, older diffusers).
- ComfyUI (what its "Extract and Save Lora" node writes, comfy_extras/nodes_lora_extract.py):
  ``diffusion_model.<original module path>.lora_up.weight`` / ``.lora_down.weight`` for the
  denoiser (LDM/SGM names of the UNet, the original FLUX.1/SD3 names of the transformer) and
  ``text_encoders.<clip_l|clip_h|clip_g|t5xxl>.transformer.<transformers path>.*`` for the text
  encoders; ComfyUI reads an ``.alpha`` beside them (comfy/lora.py), which is kept.

Which of the three a family's own files are in (what its key map writes; kohya's for most, the
"comfyui" names ``diffusion_model.<path>`` for a family whose denoiser keeps its diffusers
paths) and what its files in each are called is the family's registry entry's
(``ToolFacts.own_layout`` / ``layout_names``); ``--to difftune`` is that own layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from library.errors import CheckpointError
from library.lora_tools.base_model import DENOISER, Layer, family_label, other_family
from library.models.families.registry import entry_of
from library.networks.kohya_names import group_modules, kohya_path
from library.networks.peft_metadata import PEFT_METADATA

LAYOUTS = ("kohya", "diffusers", "comfyui")
OWN = "difftune"  # --to: the layout difftune's trainer writes for the model's family
LORA_A, LORA_B = "lora_A.weight", "lora_B.weight"
DIFFUSERS_HEADER = PEFT_METADATA
KOHYA_HEADER = "difftune.kohya_modules"
_KOHYA_PREFIXES = ("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_", "lora_te3_")
_COMFY_PREFIXES = ("diffusion_model.", "text_encoders.")
_DIFFUSERS_COMPONENTS = ("unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3")


def detect_layout(tensors: Mapping[str, torch.Tensor], source: str | Path) -> str:
    """ "kohya", "diffusers" or "comfyui": the layout of a LoRA file's keys; CheckpointError
    for a file whose keys fit none (or several) of them."""
    found = {}
    for key in tensors:
        if key.startswith(_KOHYA_PREFIXES):
            layout = "kohya"
        elif key.startswith(_COMFY_PREFIXES):
            layout = "comfyui"
        elif key.split(".", 1)[0] in _DIFFUSERS_COMPONENTS:
            layout = "diffusers"
        else:
            layout = None
        found.setdefault(layout, key)
    if None in found:
        raise CheckpointError(
            f"{source}: key {found[None]!r} is in none of the layouts convert reads (kohya "
            "lora_unet_/lora_te*_, diffusers unet./transformer./text_encoder*., ComfyUI "
            "diffusion_model./text_encoders.)"
        )
    if len(found) != 1:
        mixed = ", ".join(f"{layout} ({key})" for layout, key in found.items())
        raise CheckpointError(f"{source}: mixes key layouts: {mixed}")
    return next(iter(found))


def own_layout(family) -> str:
    """The layout difftune's trainer writes the family's files in (its key map's)."""
    return entry_of(family).tool.own_layout


def chosen_layout(layout: str, family) -> str:
    """A --to value as one of LAYOUTS (OWN: the family's own)."""
    return own_layout(family) if layout == OWN else layout


def layout_words(layout: str, family) -> str:
    """The layout in words for the family: "kohya layout (difftune's own)", "comfyui layout
    (diffusion_model.<diffusers path>; difftune's own)"."""
    notes = [entry_of(family).tool.layout_names.get(layout)]
    notes.append("difftune's own" if layout == own_layout(family) else None)
    notes = [note for note in notes if note]
    return f"{layout} layout" + (f" ({'; '.join(notes)})" if notes else "")


def diffusers_component(layer: Layer, components) -> str:
    """The pipeline component a module's diffusers keys start with."""
    family = components.family
    if layer.component == DENOISER:
        return family.denoiser_subfolder
    return family.text_encoder_subfolders[layer.component]


def diffusers_path(layer: Layer, index: int) -> str:
    """The module path of part ``index`` in diffusers' layout: the model's own, CLIP's with
    ``text_model.`` (as diffusers, peft and ComfyUI key text encoders)."""
    return (
        kohya_path(layer.model, layer.parts[index])
        if layer.component != DENOISER
        else (layer.parts[index])
    )


def loadable_components(components) -> tuple[str, ...]:
    """The components diffusers' pipeline loads LoRA weights into (``_lora_loadable_modules``)."""
    import diffusers

    kind = components.family.sampling_pipeline()
    pipeline = getattr(diffusers, kind.class_name)
    return tuple(getattr(pipeline, "_lora_loadable_modules", ()))


def diffusers_names(table: Mapping[str, Layer], components) -> dict[str, tuple[str, int]]:
    """``<component>.<module path>`` of every diffusers Linear of the model -> (the kohya name of
    its layer, its part index)."""
    names = {}
    for name, layer in table.items():
        component = diffusers_component(layer, components)
        for index in range(len(layer.parts)):
            names[f"{component}.{diffusers_path(layer, index)}"] = (name, index)
    return names


def without_layout_headers(metadata: Mapping[str, str]) -> dict[str, str]:
    """``metadata`` less the header entries that describe one layout's alphas (diffusers' and
    ours for the way back to kohya's)."""
    return {k: v for k, v in metadata.items() if k not in (DIFFUSERS_HEADER, KOHYA_HEADER)}


def known_prefix(key: str, names: Mapping[str, object]) -> str | None:
    """The longest of ``names`` that ``key`` is ``<name>.<suffix>`` of (names may contain dots);
    None when it is none of them."""
    pos = len(key)
    while (pos := key.rfind(".", 0, pos)) > 0:
        if key[:pos] in names:
            return key[:pos]
    return None


def split_keys(keys, names: Mapping[str, object]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """({name: {suffix: key}}, the keys of no name) for keys ``<name>.<suffix>``, each name one
    of ``names`` (``known_prefix``)."""
    groups: dict[str, dict[str, str]] = {}
    unknown = []
    for key in keys:
        prefix = known_prefix(key, names)
        if prefix is None:
            unknown.append(key)
        else:
            groups.setdefault(prefix, {})[key[len(prefix) + 1 :]] = key
    return groups, unknown


def check_kohya_names(tensors, metadata, table: Mapping[str, Layer], components, source) -> None:
    """CheckpointError naming the kohya modules that are no layer of the model."""
    unknown = sorted(set(group_modules(tensors)) - set(table))
    if not unknown:
        return
    raise CheckpointError(unknown_modules_message(unknown, metadata, components, source))


def unknown_modules_message(unknown: list[str], metadata, components, source) -> str:
    """One line saying which file modules name no layer of the model and the likely cause."""
    label = family_label(components.family)
    guess = other_family(unknown, metadata, components.family)
    head = (
        f"{source}: {len(unknown)} LoRA module{'s' if len(unknown) > 1 else ''} name no layer "
        f"of this {label} model, e.g. {unknown[0]}"
    )
    if guess is not None:
        return f"{head}; the file is a LoRA for {guess} models: use a {guess} base model"
    return f"{head}; the file was made for a differently shaped model or another base model"
