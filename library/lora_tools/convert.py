"""``convert``: one LoRA file between kohya's, diffusers' (peft) and ComfyUI's key layouts.

The three layouts name the same modules differently (docs: the toolbox's convert section):

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

Converting there and back gives the input again bit for bit: names change, tensors do not
(diffusers' per-Linear parts of a fused module are slices of it; the kohya alphas and shapes are
kept in the header entry ``difftune.kohya_modules`` for the way back).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from library.errors import CheckpointError, ConfigError
from library.lora_tools.base_model import (
    DENOISER,
    Layer,
    add_model_arguments,
    component_label,
    family_label,
    guess_family,
    layer_table,
    load_model,
)
from library.lora_tools.common import (
    DTYPES,
    add_output_arguments,
    checked_output,
    group_modules,
    read_file,
    refuse_input_as_output,
)

HELP = (
    "convert a LoRA file between kohya's, diffusers' (peft) and ComfyUI's key layouts "
    "(needs the base model to map the names)"
)
LAYOUTS = ("kohya", "diffusers", "comfyui")
DOWN, UP, ALPHA = "lora_down.weight", "lora_up.weight", "alpha"
LORA_A, LORA_B = "lora_A.weight", "lora_B.weight"
DIFFUSERS_HEADER = "lora_adapter_metadata"  # diffusers' LORA_ADAPTER_METADATA_KEY
KOHYA_HEADER = "difftune.kohya_modules"
_KOHYA_PREFIXES = ("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_", "lora_te3_")
_COMFY_PREFIXES = ("diffusion_model.", "text_encoders.")
_DIFFUSERS_COMPONENTS = ("unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, metavar="FILE", help="the LoRA file to convert")
    parser.add_argument(
        "--to",
        required=True,
        choices=LAYOUTS,
        help="the layout to write: kohya (sd-scripts, A1111/Forge, difftune), diffusers "
        "(pipe.load_lora_weights / peft) or comfyui (ComfyUI's own saved LoRAs)",
    )
    add_model_arguments(
        parser,
        {
            "--model": "the base model the LoRA is for; needed to map kohya's module names to "
            "diffusers' and ComfyUI's module paths (and back)"
        },
        precision=False,
    )
    parser.add_argument(
        "--fold_alpha",
        action="store_true",
        help="--to diffusers: multiply each module's alpha / rank into lora_B (scale 1 for every "
        "reader) instead of keeping alpha in the lora_adapter_metadata header; converting "
        "back then gives alpha = rank (the same weight change, other numbers)",
    )
    add_output_arguments(parser, "converted LoRA file")


def run(args: argparse.Namespace) -> int:
    output = checked_output(args.output, args.overwrite)
    refuse_input_as_output(output, [args.input])
    if args.fold_alpha and args.to != "diffusers":
        raise ConfigError("--fold_alpha applies to --to diffusers only; remove it")
    tensors, metadata = read_file(args.input)
    source = detect_layout(tensors, args.input)
    if source == args.to:
        raise ConfigError(
            f"--input {args.input} is already in the {args.to} layout; nothing to convert"
        )
    components = load_model(args, args.model)
    table = layer_table(components)
    kohya, meta = (
        (tensors, metadata)
        if source == "kohya"
        else to_kohya(tensors, metadata, components, table, args.input)
    )
    if args.to == "kohya":
        out, out_meta = kohya, meta
    else:
        check_kohya_names(kohya, meta, table, components, args.input)
        if args.to == "diffusers":
            out, out_meta = kohya_to_diffusers(kohya, meta, table, components, args.fold_alpha)
        else:
            out, out_meta = kohya_to_comfy(kohya, meta, table, components)
    dtype = DTYPES[args.save_precision] if args.save_precision else None
    write_converted(output, out, out_meta, dtype, had_hashes="sshs_model_hash" in metadata)
    print(
        f"converted {args.input} ({source} layout, {len(tensors)} tensors) to the {args.to} "
        f"layout: {output} ({len(out)} tensors)"
    )
    return 0


# -- layouts -------------------------------------------------------------------------------------


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


def comfy_clip_names(components) -> tuple[str, ...]:
    """ComfyUI's name of each text encoder (its CLIP model's state-dict prefix): clip_l, clip_h
    (SD 2.x's OpenCLIP-H), clip_g, t5xxl."""
    names = []
    clips = 0
    for encoder in components.text_encoders:
        if type(encoder).__name__.startswith("T5"):
            names.append("t5xxl")
            continue
        if clips == 0:
            names.append("clip_h" if components.family.v2 else "clip_l")
        else:
            names.append("clip_g")
        clips += 1
    return tuple(names)


def comfy_name(layer: Layer, components) -> str:
    """The module's name in ComfyUI's own layout (what its LoRA-save node writes)."""
    from library.models.original_names import unet_path_to_original

    if layer.component == DENOISER:
        original = layer.original
        if type(layer.model).__name__ == "UNet2DConditionModel":
            original = unet_path_to_original(layer.parts[0], layer.model.config)
        return f"diffusion_model.{original}"
    clip = comfy_clip_names(components)[layer.component]
    return f"text_encoders.{clip}.transformer.{layer.original}"


def diffusers_component(layer: Layer, components) -> str:
    """The pipeline component a module's diffusers keys start with."""
    family = components.family
    if layer.component == DENOISER:
        return family.denoiser_subfolder
    return family.text_encoder_subfolders[layer.component]


def diffusers_path(layer: Layer, index: int) -> str:
    """The module path of part ``index`` in diffusers' layout: the model's own, CLIP's with
    ``text_model.`` (as diffusers, peft and ComfyUI key text encoders)."""
    from library.networks.kohya_keys import kohya_path

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


# -- kohya -> others ------------------------------------------------------------------------------


def check_kohya_names(tensors, metadata, table: Mapping[str, Layer], components, source) -> None:
    """CheckpointError naming the kohya modules that are no layer of the model."""
    unknown = sorted(set(group_modules(tensors)) - set(table))
    if not unknown:
        return
    raise CheckpointError(unknown_modules_message(unknown, metadata, components, source))


def unknown_modules_message(unknown: list[str], metadata, components, source) -> str:
    """One line saying which file modules name no layer of the model and the likely cause."""
    from library.lora_tools.base_model import family_group

    label = family_label(components.family)
    guess = guess_family(unknown, metadata)
    head = (
        f"{source}: {len(unknown)} LoRA module{'s' if len(unknown) > 1 else ''} name no layer "
        f"of this {label} model, e.g. {unknown[0]}"
    )
    if guess is not None and guess != family_group(components.family):
        return f"{head}; the file is a LoRA for {guess} models: use a {guess} base model"
    return f"{head}; the file was made for a differently shaped model or another base model"


def kohya_to_comfy(tensors, metadata, table: Mapping[str, Layer], components):
    """Rename kohya modules to ComfyUI's names; every tensor (LyCORIS ones too) is kept."""
    out = {}
    for name, parts in group_modules(tensors).items():
        new = comfy_name(table[name], components)
        for suffix, tensor in parts.items():
            out[f"{new}.{suffix}"] = tensor
    return out, dict(metadata)


def _plain(name: str, parts: Mapping[str, torch.Tensor], what: str) -> None:
    extra = sorted(set(parts) - {DOWN, UP, ALPHA})
    if extra or DOWN not in parts or UP not in parts:
        detail = f"{name}.{extra[0]}" if extra else f"{name} without lora_down/lora_up"
        raise CheckpointError(
            f"{detail}: {what} holds only plain LoRA factors (lora_down/lora_up/alpha); "
            "LyCORIS modules (LoHa, LoKr, DoRA, Tucker) cannot be written in it"
        )


def split_module(layer: Layer, down: torch.Tensor, up: torch.Tensor, alpha: float | None):
    """Per-part (down, up, alpha or None) of a kohya module, and whether it was dense.

    A fused module whose up is block-diagonal with equal part ranks (difftune's files, kohya's
    split_qkv) splits into its blocks, each with alpha / n; any other gives every part the whole
    down and its rows of up. Rows come back in diffusers' order (swapped halves undone). A
    missing alpha (scale 1) stays None.
    """
    ups = layer.split(up)
    if not layer.fused:
        return [(down, ups[0], alpha)], False
    rank, count = down.shape[0], len(layer.parts)
    if rank % count == 0:
        part = rank // count
        blocks = all(
            not u[:, : i * part].any() and not u[:, (i + 1) * part :].any()
            for i, u in enumerate(ups)
        )
        if blocks:
            each = None if alpha is None else alpha / count
            return [
                (down[i * part : (i + 1) * part], u[:, i * part : (i + 1) * part], each)
                for i, u in enumerate(ups)
            ], False
    return [(down, u, alpha) for u in ups], True


def _peft_shape(tensor: torch.Tensor, module: torch.nn.Module, kind: str) -> torch.Tensor:
    """``tensor`` shaped as peft's lora_A / lora_B of ``module``: 2-d for a Linear, 4-d for a
    Conv2d (lora_A carries the kernel, lora_B is 1x1)."""
    if isinstance(module, torch.nn.Conv2d):
        if tensor.dim() == 2:
            if kind == LORA_A:
                return tensor.reshape(tensor.shape[0], module.in_channels, *module.kernel_size)
            return tensor.reshape(*tensor.shape, 1, 1)
        return tensor
    return tensor.reshape(tensor.shape[0], tensor.shape[1]) if tensor.dim() == 4 else tensor


def kohya_to_diffusers(tensors, metadata, table: Mapping[str, Layer], components, fold: bool):
    """kohya modules -> diffusers' peft keys, the alphas in diffusers' header (or folded)."""
    loadable = loadable_components(components)
    out: dict[str, torch.Tensor] = {}
    configs: dict[str, dict[str, tuple[int, float]]] = {}
    record = {}
    for name, parts in sorted(group_modules(tensors).items()):
        _plain(name, parts, "diffusers' layout")
        layer = table[name]
        component = diffusers_component(layer, components)
        if component not in loadable:
            what = component_label(components, layer.component)
            raise CheckpointError(
                f"{name}: the {what} has no place in diffusers' {family_label(components.family)} "
                f"LoRA layout (its pipeline loads LoRA weights into {', '.join(loadable)} only); "
                "keep the file in kohya's layout"
            )
        alpha_tensor = parts.get(ALPHA)
        alpha = None if alpha_tensor is None else float(alpha_tensor.float().item())
        down, up = parts[DOWN], parts[UP]
        pieces, dense = split_module(layer, down, up, alpha)
        record[name] = {
            "alpha": alpha,
            "alpha_dtype": None if alpha_tensor is None else str(alpha_tensor.dtype).split(".")[-1],
            "down_shape": list(down.shape),
            "up_shape": list(up.shape),
            "dense": dense,
        }
        for index, (part_down, part_up, part_alpha) in enumerate(pieces):
            module = layer.modules[index]
            path = diffusers_path(layer, index)
            rank = int(part_down.shape[0])
            scale = 1.0 if part_alpha is None else part_alpha / rank
            lora_b = _peft_shape(part_up, module, LORA_B)
            if fold and scale != 1.0:
                lora_b = (lora_b.float() * scale).to(part_up.dtype)
            out[f"{component}.{path}.{LORA_A}"] = _peft_shape(part_down, module, LORA_A).clone()
            out[f"{component}.{path}.{LORA_B}"] = lora_b.clone()
            alpha_value = float(rank) if fold or part_alpha is None else part_alpha
            configs.setdefault(component, {})[path] = (rank, alpha_value)
    meta = {k: v for k, v in metadata.items() if k not in (DIFFUSERS_HEADER, KOHYA_HEADER)}
    header = _adapter_metadata(configs)
    if header:
        meta[DIFFUSERS_HEADER] = json.dumps(header, indent=2, sort_keys=True)
    if not fold:
        meta[KOHYA_HEADER] = json.dumps(record, sort_keys=True)
    return out, meta


def _pattern(path: str) -> str:
    """A peft rank/alpha pattern matching exactly the module ``path`` (its text_model. prefix
    left out, so it also matches transformers 5's flattened CLIP)."""
    return re.escape(path.removeprefix("text_model."))


def _adapter_metadata(configs: Mapping[str, Mapping[str, tuple[int, float]]]) -> dict:
    """diffusers' lora_adapter_metadata (LoraConfig keywords per component) giving each path
    its rank and alpha; empty when every alpha equals its rank (the layout's default)."""
    if all(rank == alpha for paths in configs.values() for rank, alpha in paths.values()):
        return {}
    header = {}
    for component, paths in sorted(configs.items()):
        ranks = [rank for rank, _ in paths.values()]
        alphas = [alpha for _, alpha in paths.values()]
        r = max(set(ranks), key=ranks.count)
        lora_alpha = max(set(alphas), key=alphas.count)
        header.update(
            {
                f"{component}.r": r,
                f"{component}.lora_alpha": lora_alpha,
                f"{component}.target_modules": sorted(
                    path.removeprefix("text_model.") for path in paths
                ),
                f"{component}.rank_pattern": {
                    _pattern(p): rank for p, (rank, _) in sorted(paths.items()) if rank != r
                },
                f"{component}.alpha_pattern": {
                    _pattern(p): alpha
                    for p, (_, alpha) in sorted(paths.items())
                    if alpha != lora_alpha
                },
            }
        )
    return header


# -- others -> kohya ------------------------------------------------------------------------------


def to_kohya(
    tensors, metadata, components, table: Mapping[str, Layer], source, unknown: list | None = None
):
    """A diffusers- or ComfyUI-layout file in kohya's layout, for the model ``components``
    whose ``layer_table`` is ``table``; a kohya file as it is. Keys that name no layer of the
    model are a CheckpointError, or with an ``unknown`` list are appended to it and left out."""
    layout = detect_layout(tensors, source)
    if layout == "comfyui":
        return comfy_to_kohya(tensors, metadata, table, components, source, unknown)
    if layout == "diffusers":
        return diffusers_to_kohya(tensors, metadata, table, components, source, unknown)
    return dict(tensors), dict(metadata)


def _split_names(keys, names: Mapping[str, str], source, components, unknown_out=None):
    """{kohya name: {suffix: key}} for keys ``<layout name>.<suffix>``, the layout names being
    ``names``' keys (they may contain dots); keys of no known name are a CheckpointError, or
    appended to ``unknown_out`` when it is a list."""
    groups: dict[str, dict[str, str]] = {}
    unknown = []
    for key in keys:
        pos = len(key)
        while True:
            pos = key.rfind(".", 0, pos)
            if pos <= 0:
                unknown.append(key)
                break
            if key[:pos] in names:
                groups.setdefault(names[key[:pos]], {})[key[pos + 1 :]] = key
                break
    if unknown and unknown_out is not None:
        unknown_out.extend(unknown)
    elif unknown:
        raise CheckpointError(
            f"{source}: {len(unknown)} keys name no layer of this "
            f"{family_label(components.family)} model, e.g. {sorted(unknown)[0]}; the file is for "
            "another model"
        )
    return groups


def comfy_to_kohya(tensors, metadata, table, components, source, unknown=None):
    names = {comfy_name(layer, components): name for name, layer in table.items()}
    groups = _split_names(tensors, names, source, components, unknown)
    out = {
        f"{name}.{suffix}": tensors[key]
        for name, keys in groups.items()
        for suffix, key in keys.items()
    }
    return out, dict(metadata)


def _diffusers_alphas(metadata: Mapping[str, str]) -> dict[str, dict]:
    """component -> LoraConfig keywords of diffusers' lora_adapter_metadata header (empty when
    the file has none)."""
    raw = metadata.get(DIFFUSERS_HEADER)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    configs: dict[str, dict] = {}
    for key, value in data.items():
        component, _, field = key.partition(".")
        configs.setdefault(component, {})[field] = value
    return configs


def _peft_alpha(config: Mapping, path: str, rank: int) -> float:
    """The alpha peft gives ``path`` under LoraConfig keywords ``config`` (its alpha_pattern,
    matched as peft's get_pattern_key does, else lora_alpha); rank when there is no config."""
    if not config:
        return float(rank)
    for pattern, alpha in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", path):
            return float(alpha)
    return float(config.get("lora_alpha", rank))


def diffusers_to_kohya(tensors, metadata, table, components, source, unknown=None):
    """diffusers' per-Linear peft keys -> kohya modules (fused parts joined again)."""
    names = {}
    for name, layer in table.items():
        component = diffusers_component(layer, components)
        for index in range(len(layer.parts)):
            names[f"{component}.{diffusers_path(layer, index)}"] = (name, index)
    lookup = {key: key for key in names}
    groups = _split_names(tensors, lookup, source, components, unknown)
    configs = _diffusers_alphas(metadata)
    try:
        record = json.loads(metadata.get(KOHYA_HEADER, "{}"))
    except ValueError:
        record = {}
    per_module: dict[str, dict[int, tuple]] = {}
    for key_name, keys in groups.items():
        extra = sorted(set(keys) - {LORA_A, LORA_B, ALPHA})
        if extra or LORA_A not in keys or LORA_B not in keys:
            what = f"{key_name}.{extra[0]}" if extra else f"{key_name} without lora_A/lora_B"
            raise CheckpointError(f"{source}: {what}: not a diffusers/peft LoRA tensor pair")
        name, index = names[key_name]
        lora_a, lora_b = tensors[keys[LORA_A]], tensors[keys[LORA_B]]
        component, _, path = key_name.partition(".")
        rank = int(lora_a.shape[0])
        if ALPHA in keys:
            alpha = float(tensors[keys[ALPHA]].float().item())
        else:
            alpha = _peft_alpha(configs.get(component, {}), path, rank)
        per_module.setdefault(name, {})[index] = (lora_a, lora_b, alpha)
    out: dict[str, torch.Tensor] = {}
    for name in sorted(per_module):
        down, up, alpha = _join_module(table[name], per_module[name], record.get(name))
        out[f"{name}.{DOWN}"] = down
        out[f"{name}.{UP}"] = up
        if alpha is not None:
            out[f"{name}.{ALPHA}"] = alpha
    meta = {k: v for k, v in metadata.items() if k not in (DIFFUSERS_HEADER, KOHYA_HEADER)}
    return out, meta


def _alpha_tensor(value: float, dtype_name: str | None = None) -> torch.Tensor:
    dtype = getattr(torch, dtype_name or "float32", torch.float32)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float32
    return torch.tensor(value, dtype=dtype)


def _join_module(layer: Layer, parts: Mapping[int, tuple], record: Mapping | None):
    """One kohya (down, up, alpha tensor or None) from per-part (lora_A, lora_B, alpha)."""
    count = len(layer.parts)
    if record and _fits_record(layer, parts, record):
        return _from_record(layer, parts, record)
    if count == 1:
        lora_a, lora_b, alpha = parts[0]
        return lora_a.clone(), layer.join([lora_b]).clone(), _alpha_tensor(alpha)
    present = sorted(parts)
    downs = [parts[i][0].reshape(parts[i][0].shape[0], -1) for i in present]
    alphas = [parts[i][2] for i in present]
    if (
        len(present) == count
        and all(torch.equal(downs[0], d) for d in downs[1:])
        and len(set(alphas)) == 1
    ):
        # one shared down: a dense fused module (kohya's default for q, k and v)
        ups = [parts[i][1].reshape(parts[i][1].shape[0], -1) for i in range(count)]
        return downs[0].clone(), layer.join(ups), _alpha_tensor(alphas[0])
    ranks = [d.shape[0] for d in downs]
    scales = [a / r for a, r in zip(alphas, ranks, strict=True)]
    same = all(abs(s - scales[0]) <= 1e-6 * abs(scales[0]) for s in scales)
    rows = layer.rows
    ref = parts[present[0]][1]
    up = ref.new_zeros((sum(rows), sum(ranks)))
    row_starts = [sum(rows[:i]) for i in range(count)]
    col = 0
    for i, rank, scale in zip(present, ranks, scales, strict=True):
        block = parts[i][1].reshape(rows[i], rank)
        if not same:
            block = (block.float() * scale).to(block.dtype)
        up[row_starts[i] : row_starts[i] + rows[i], col : col + rank] = block
        col += rank
    alpha = scales[0] * sum(ranks) if same else float(sum(ranks))
    if layer.swapped_halves:
        up = layer.join([up])
    return torch.cat(downs, dim=0), up, _alpha_tensor(alpha)


def _fits_record(layer: Layer, parts, record) -> bool:
    if len(parts) != len(layer.parts):
        return False
    down_shape, up_shape = record.get("down_shape"), record.get("up_shape")
    if not isinstance(down_shape, list) or not isinstance(up_shape, list):
        return False
    rank = down_shape[0]
    if record.get("dense"):
        return all(p[0].shape[0] == rank for p in parts.values())
    return sum(p[0].shape[0] for p in parts.values()) == rank


def _from_record(layer: Layer, parts, record):
    """The kohya tensors exactly as they were written before ``kohya_to_diffusers``."""
    count = len(layer.parts)
    down_shape, up_shape = record["down_shape"], record["up_shape"]
    ups = [parts[i][1].reshape(parts[i][1].shape[0], -1) for i in range(count)]
    if count == 1 or record.get("dense"):
        down, up = parts[0][0], layer.join(ups)
    else:
        down = torch.cat([parts[i][0].reshape(parts[i][0].shape[0], -1) for i in range(count)])
        rank = down.shape[0] // count
        full = ups[0].new_zeros((sum(layer.rows), down.shape[0]))
        row = 0
        for i, block in enumerate(ups):
            full[row : row + block.shape[0], i * rank : (i + 1) * rank] = block
            row += block.shape[0]
        up = layer.join([full])
    alpha = record.get("alpha")
    alpha_tensor = None if alpha is None else _alpha_tensor(alpha, record.get("alpha_dtype"))
    return (
        down.reshape(down_shape).clone(),
        up.reshape(up_shape).clone(),
        alpha_tensor,
    )


# -- writing --------------------------------------------------------------------------------------


def write_converted(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str],
    dtype: torch.dtype | None,
    had_hashes: bool,
) -> Path:
    """Write ``tensors`` as they are (or their weights cast to ``dtype``; alphas stay as they
    are) with ``metadata``, atomically; kohya's two hashes are recomputed when the input had
    them, so converting there and back gives the input file's tensors and header again."""
    from safetensors.torch import save_file

    from library.saving.atomic import atomic_write_file
    from library.saving.lora_file import _model_hashes

    prepared = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point() and not key.endswith(".alpha"):
            tensor = tensor.to(dtype)
        prepared[key] = tensor.contiguous()
    header = {k: v for k, v in metadata.items() if not k.startswith("sshs_")}
    if had_hashes:
        header.update(_model_hashes(prepared, header))
    final = header or None
    return atomic_write_file(path, lambda tmp: save_file(prepared, str(tmp), metadata=final))
