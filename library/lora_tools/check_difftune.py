"""``check --loader difftune``: the trainer's ``network_weights`` import of a LoRA file.

Every module must name a layer a difftune adapter can sit on (a default LoRA's layers with
LoCon's convs; LyCORIS' "full" preset for LyCORIS files on the families that train them) with
tensors of fitting shapes; a file that passes is then really imported, into adapters injected
with the file's ranks, by the trainer's own import (library/networks/network_weights.py: the
layouts it takes, the file checks, the family's key map). Which layouts a family reads is
therefore never decided here: a file the import refuses is reported with the import's reason.
"""

from __future__ import annotations

from torch import nn

from library.errors import DifftuneError
from library.lora_tools.adapters import remove_adapters
from library.lora_tools.base_model import DENOISER, Layer, default_layers, family_label
from library.lora_tools.common import ALPHA, DOWN, KOHYA_LORA, UP, module_algorithm
from library.lora_tools.file_modules import FileModules, report_unreadable
from library.lora_tools.from_kohya import split_module
from library.lora_tools.layouts import DIFFUSERS_HEADER, OWN, own_layout
from library.lora_tools.loader_report import Report
from library.networks.kohya_names import UNET
from library.networks.lora import LoraSpec, apply_lora
from library.networks.lycoris import file_math
from library.networks.network_weights import import_network_weights


def check_difftune(found: FileModules, tensors, metadata, components, table, source) -> Report:
    """The trainer's network_weights import (library/networks/network_weights.py)."""
    report = Report("difftune")
    family = components.family
    label = family_label(family)
    report_unreadable(report, found, metadata, components)
    adaptable = set(default_layers(components, conv=True))
    lycoris = (
        _lycoris_layers(components, table) if "lycoris.kohya" in family.network_modules else None
    )
    for name, parts in sorted(found.modules.items()):
        reason = _difftune_module(name, parts, table[name], adaptable, lycoris, label)
        if reason:
            report.drop(found.keys[name], reason)
    if report.dropped:
        return report
    own = own_layout(family)
    plain = all(module_algorithm(parts) in KOHYA_LORA for parts in found.modules.values())
    if not plain:
        other = "" if found.layout == own else f" (in the {found.layout} layout, not difftune's)"
        report.notes.append(f"LyCORIS file{other}: checked by names and shapes (no trial import)")
        return report
    problem = _trial_import(found, tensors, metadata, components, table, source)
    if problem is not None:
        kind, text = problem
        if kind == "note":
            report.notes.append(text)
        else:
            hint = (
                ""
                if found.layout == own
                else f"; convert it with lora_tool.py convert --to {own} (the layout difftune "
                f"writes for {label}; --to {OWN} says the same)"
            )
            report.drop(tensors, f"the import refuses the file: {text}{hint}")
            return report
    if found.layout == "diffusers" and DIFFUSERS_HEADER in metadata:
        report.notes.append(
            "difftune reads diffusers-layout files at scale 1 (alpha = rank) and ignores the "
            "lora_adapter_metadata header's alphas"
        )
    return report


def _lycoris_layers(components, table) -> set[str]:
    """kohya names of the layers LyCORIS' widest preset ("full") adapts."""
    wanted: dict[int, set[str]] = {}
    family = components.family
    # FLUX.1 / SD3: one LyCORIS module per original (fused) layer, named by the family
    fused = getattr(family, "lycoris_modules", None)
    named = {m.name for m in fused(components.denoiser, "full")} if fused else set()
    try:
        if not fused:
            wanted[DENOISER] = set(family.lycoris_targets(components.denoiser, "unet", "full"))
        for index, encoder in enumerate(components.text_encoders):
            if fused and index == len(components.text_encoders) - 1:
                continue  # T5: LyCORIS' presets name no T5 block
            if not family.trains_text_encoder(index):
                continue  # a family whose adapters never sit on this text encoder
            wanted[index] = set(family.lycoris_targets(encoder, "text_encoder", "full"))
    except (NotImplementedError, AttributeError, KeyError, DifftuneError):
        return named
    return named | {
        name
        for name, layer in table.items()
        if all(path in wanted.get(layer.component, ()) for path in layer.parts)
    }


def _difftune_module(name, parts, layer: Layer, adaptable, lycoris, label) -> str | None:
    algorithm = module_algorithm(parts)
    if algorithm in KOHYA_LORA:
        if name not in adaptable:
            return (
                f"a difftune LoRA has no adapter on this layer (it adapts the {label} "
                "attention/MLP Linears, and 3x3 convs with conv_dim), so network_weights "
                "cannot load it"
            )
    elif lycoris is None:
        return f"a {algorithm} module: difftune reads no LyCORIS modules for {label}"
    elif name not in lycoris:
        return "no LyCORIS preset difftune trains adapts this layer"
    try:
        file_math.check_shapes(parts, layer.shape)
    except ValueError as exc:
        return f"does not fit the layer: {exc}"
    return None


def _trial_import(found: FileModules, tensors, metadata, components, table, source):
    """Inject adapters with the file's ranks on its layers and run the trainer's import
    (import_network_weights); ("error", why) when it refuses, ("note", what) when no trial is
    possible, else None."""
    targets: dict[int, dict[str, str]] = {}
    ranks: dict[str, set[int]] = {"linear": set(), "conv": set()}
    for name, parts in found.modules.items():
        layer = table[name]
        alpha = parts.get(ALPHA)
        pieces, _ = split_module(
            layer,
            parts[DOWN],
            parts[UP],
            None if alpha is None else float(alpha.float().item()),
        )
        for index, (down, _, _) in enumerate(pieces):
            module = layer.modules[index]
            spatial = isinstance(module, nn.Conv2d) and tuple(module.kernel_size) != (1, 1)
            kind = "conv" if spatial else "linear"
            targets.setdefault(layer.component, {})[layer.parts[index]] = kind
            ranks[kind].add(int(down.shape[0]))
    if any(len(values) > 1 for values in ranks.values()):
        listed = ", ".join(f"{kind} {sorted(values)}" for kind, values in ranks.items() if values)
        return (
            "note",
            f"modules of several ranks ({listed}): network_weights needs one network_dim (and "
            "one conv_dim); resize the file to train on from it",
        )
    dim = next(iter(ranks["linear"] or ranks["conv"]))
    conv = next(iter(ranks["conv"]), None)
    spec = LoraSpec(dim, float(dim), conv, None if conv is None else float(conv))
    family = components.family
    models: dict[str, nn.Module] = {}
    adapted = []
    try:
        for component, paths in sorted(targets.items()):
            model = (
                components.denoiser
                if component == DENOISER
                else (components.text_encoders[component])
            )
            apply_lora(model, paths, spec)
            adapted.append(model)
            prefix = UNET if component == DENOISER else family.text_encoder_lora_prefixes[component]
            models[prefix] = model
        import_network_weights(family, models, tensors, source, metadata)
    except (DifftuneError, ValueError, RuntimeError, KeyError) as exc:
        return ("error", str(exc).removeprefix(f"{source}: "))
    finally:
        for model in adapted:
            remove_adapters(model)
    return None
