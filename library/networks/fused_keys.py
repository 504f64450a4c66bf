"""kohya LoRA modules named after an original model whose Linears diffusers split or reorder.

kohya's LoRA networks for the transformer models (``networks.lora_flux``, ``networks.lora_sd3``)
name a module ``lora_unet_`` + its path in the ORIGINAL model with dots as underscores, and
ComfyUI merges ``alpha / rank * up @ down`` into that original weight. The original models
compute q, k and v (FLUX.1's single blocks: q, k, v and the MLP input) with one fused Linear
where diffusers has separate Linears, and a few original Linears keep their output rows in
another order than diffusers' (SD3's pre-only context modulation: shift, scale where diffusers
has scale, shift). A :class:`KohyaModule` records which diffusers Linears one kohya name stands
for, in the order of the original weight's rows, and whether the two halves of those rows are
exchanged; a family's key table (library/models/families/flux/lora_keys.py,
library/models/families/sd3/lora_keys.py) lists them.

Separate adapters on the parts of a fused layer are written as ONE kohya module whose down
weights are stacked ([sum r, in]) and whose up weight is block-diagonal ([sum out, sum r]). Its
product is exactly the stacked per-part deltas, so every reader that merges ``alpha / rank * up @
down`` into the fused weight (kohya, ComfyUI) applies the same change, and diffusers recognises
the layout and splits it back. Readers take the rank from the file's down weight, so the file's
alpha is ``scale * sum r``: the parts must share one scale ``alpha / r``. A module with swapped
halves has its up weight's rows exchanged in halves on export and back on import, so the file's
rows are the original model's.

Text encoders are one-to-one (:func:`text_encoder_modules`): kohya's
TEXT_ENCODER_TARGET_REPLACE_MODULE blocks, named by their transformers 4 paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from library.errors import CheckpointError
from library.networks.kohya_names import ALPHA, DOWN, UP, kohya_name, kohya_path, unwrap
from library.networks.lora import ADAPTER, lora_layers, lora_rank, set_lora_scale

# (down [r, in], up [out, r], alpha) of one adapted diffusers Linear; its scale is alpha / r.
LoraWeights = tuple[torch.Tensor, torch.Tensor, float]

# kohya's TEXT_ENCODER_TARGET_REPLACE_MODULE (lora_flux, lora_sd3): every Linear inside these
# blocks is adapted.
_TEXT_BLOCKS = (
    "CLIPAttention",
    "CLIPSdpaAttention",
    "CLIPMLP",
    "T5Attention",
    "T5DenseGatedActDense",
)


@dataclass(frozen=True)
class KohyaModule:
    """One module of a kohya LoRA file and the diffusers Linears it stands for.

    ``original`` is the module's path in the original model (the name without the prefix, with
    dots), ``parts`` the diffusers paths in the order of the original weight's output rows, and
    ``out_features`` their output sizes. A module with one part is a plain rename.
    ``swapped_halves``: the original weight's rows are the parts' rows with their first and
    second halves exchanged (SD3's pre-only context modulation, stored (scale, shift) by
    diffusers and (shift, scale) in the original model).
    """

    name: str
    original: str
    parts: tuple[str, ...]
    in_features: int
    out_features: tuple[int, ...]
    swapped_halves: bool = False

    @property
    def fused(self) -> bool:
        return len(self.parts) > 1


def _linear(model: nn.Module, path: str) -> nn.Linear:
    module = model.get_submodule(path)
    # An adapted layer is a peft wrapper around the original Linear.
    module = getattr(module, "base_layer", module)
    if not isinstance(module, nn.Linear):
        raise ValueError(f"{path} is a {type(module).__name__}, not a Linear")
    return module


def kohya_module(
    model: nn.Module,
    prefix: str,
    original: str,
    parts: Iterable[str],
    *,
    swapped_halves: bool = False,
) -> KohyaModule:
    """The kohya module ``prefix`` + ``original`` standing for the Linears ``parts`` of
    ``model`` (diffusers paths, in the order of the fused weight's rows); ValueError when they
    are not Linears taking one input."""
    parts = tuple(parts)
    layers = [_linear(model, path) for path in parts]
    in_features = {layer.in_features for layer in layers}
    if len(in_features) != 1:
        raise ValueError(f"the parts of {original} take different inputs: {parts}")
    out_features = tuple(layer.out_features for layer in layers)
    if swapped_halves and sum(out_features) % 2:
        raise ValueError(f"{original} has {sum(out_features)} output rows: no two halves to swap")
    return KohyaModule(
        name=kohya_name(prefix, original),
        original=original,
        parts=parts,
        in_features=in_features.pop(),
        out_features=out_features,
        swapped_halves=swapped_halves,
    )


def text_encoder_modules(text_encoder: nn.Module, prefix: str) -> list[KohyaModule]:
    """The kohya modules of a CLIP (prefix ``lora_te1``/``lora_te2``) or T5 (``lora_te3``).

    Every Linear inside the attention and MLP blocks kohya targets: q/k/v/out_proj, fc1, fc2
    for CLIP; q, k, v, o, wi_0, wi_1, wo for T5 (gated-GELU feed-forward, as T5 v1.1 has).
    """
    text_encoder = unwrap(text_encoder)
    modules: list[KohyaModule] = []
    for block_path, block in text_encoder.named_modules():
        if type(block).__name__ not in _TEXT_BLOCKS:
            continue
        for sub_path in linears_inside(block):
            path = f"{block_path}.{sub_path}"
            original = kohya_path(text_encoder, path)
            modules.append(kohya_module(text_encoder, prefix, original, (path,)))
    return modules


def linears_inside(block: nn.Module) -> list[str]:
    """Paths of the Linears below ``block``; a peft wrapper counts as its base Linear."""
    found: list[str] = []
    for path, module in block.named_modules():
        # The adapter's own lora_A/lora_B Linears live inside the wrapper: not model layers.
        if not path or any(path.startswith(f"{outer}.") for outer in found):
            continue
        if isinstance(getattr(module, "base_layer", module), nn.Linear):
            found.append(path)
    return found


def class_block_linears(model: nn.Module, block_class: str) -> dict[str, list[str]]:
    """The path of each block of class ``block_class`` (by name, in module order) -> the Linears
    inside it, relative to it (``linears_inside``): the Linears a family's LoRA picks from. Works
    on a model on the meta device, wrapped (DDP, torch.compile) or already given adapters."""
    return {
        path: linears_inside(module)
        for path, module in unwrap(model).named_modules()
        if type(module).__name__ == block_class
    }


def target_paths(modules: Iterable[KohyaModule]) -> list[str]:
    """The diffusers Linears to give adapters (every part of every module), sorted."""
    return sorted(path for module in modules for path in module.parts)


def _check_weights(module: KohyaModule, index: int, weights: LoraWeights) -> None:
    down, up, _ = weights
    path = module.parts[index]
    if down.dim() != 2 or up.dim() != 2 or up.shape[1] != down.shape[0]:
        raise ValueError(
            f"{path}: down {list(down.shape)} and up {list(up.shape)} are not a Linear LoRA pair"
        )
    if down.shape[1] != module.in_features or up.shape[0] != module.out_features[index]:
        raise ValueError(
            f"{path}: LoRA shapes down {list(down.shape)} / up {list(up.shape)} do not fit the "
            f"layer ({module.in_features} -> {module.out_features[index]})"
        )


def export_lora(
    modules: Iterable[KohyaModule], weights: Mapping[str, LoraWeights]
) -> dict[str, torch.Tensor]:
    """kohya state dict of per-diffusers-path LoRA weights (down, up, alpha).

    A module is written when its parts have weights, and all of them must: a fused module
    becomes one block-diagonal kohya module, which requires its parts to share one scale
    ``alpha / r`` (ranks may differ). A module with swapped halves gets its up rows in the
    original order. Weights keep their dtype; alpha is a 0-d float32 tensor. A path no module
    covers is a ValueError.
    """
    modules = list(modules)
    covered = {path for module in modules for path in module.parts}
    unknown = sorted(set(weights) - covered)
    if unknown:
        raise ValueError(f"{len(unknown)} adapted layers have no kohya name, e.g. {unknown[0]}")
    tensors: dict[str, torch.Tensor] = {}
    for module in modules:
        present = [path in weights for path in module.parts]
        if not any(present):
            continue
        if not all(present):
            missing = [p for p, ok in zip(module.parts, present, strict=True) if not ok]
            raise ValueError(
                f"{module.name} fuses {', '.join(module.parts)}; all or none of them must be "
                f"adapted, but {', '.join(missing)} are not"
            )
        parts = [weights[path] for path in module.parts]
        for index, part in enumerate(parts):
            _check_weights(module, index, part)
        down, up, alpha = _fuse(module, parts)
        if module.swapped_halves:
            up = _swap_halves(up)
        tensors[f"{module.name}.{DOWN}"] = down
        tensors[f"{module.name}.{UP}"] = up
        tensors[f"{module.name}.{ALPHA}"] = torch.tensor(alpha, dtype=torch.float32)
    return tensors


def _swap_halves(up: torch.Tensor) -> torch.Tensor:
    """``up`` with its first and second halves of rows exchanged (its own inverse)."""
    half = up.shape[0] // 2
    return torch.cat([up[half:], up[:half]], dim=0)


def _fuse(
    module: KohyaModule, parts: list[LoraWeights]
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One kohya (down, up, alpha) for the parts of ``module``: stacked downs, block-diagonal up."""
    if len(parts) == 1:
        down, up, alpha = parts[0]
        return down.detach().clone(), up.detach().clone(), float(alpha)
    scales = [float(alpha) / down.shape[0] for down, _, alpha in parts]
    if any(abs(s - scales[0]) > 1e-6 * abs(scales[0]) for s in scales):
        raise ValueError(
            f"{module.name}: the fused layers {', '.join(module.parts)} have different scales "
            f"alpha/r {scales}; kohya's format keeps one alpha per fused layer"
        )
    ranks = [down.shape[0] for down, _, _ in parts]
    down = torch.cat([d.detach() for d, _, _ in parts], dim=0)
    up = parts[0][1].new_zeros((sum(module.out_features), sum(ranks)))
    row = col = 0
    for (_, part_up, _), rank, rows in zip(parts, ranks, module.out_features, strict=True):
        up[row : row + rows, col : col + rank] = part_up.detach()
        row, col = row + rows, col + rank
    # Readers divide alpha by the stacked rank sum(r); this keeps every part's alpha / r.
    return down, up, scales[0] * sum(ranks)


def _group(tensors: Mapping[str, torch.Tensor], source: str) -> dict[str, dict[str, torch.Tensor]]:
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name, _, kind = key.partition(".")
        if kind not in (DOWN, UP, ALPHA):
            raise CheckpointError(f"{source}: unexpected key {key!r} (not a kohya LoRA tensor)")
        groups.setdefault(name, {})[kind] = tensor
    return groups


def import_lora(
    modules: Iterable[KohyaModule], tensors: Mapping[str, torch.Tensor], source: str
) -> dict[str, LoraWeights]:
    """Per-diffusers-path (down, up, alpha) of a kohya LoRA state dict.

    Reads our block-diagonal files and kohya's own: a fused module whose up is block-diagonal
    with equal part ranks (ours, kohya's split_qkv, diffusers' reading of "sparse" weights) is
    split into its blocks; any other (a dense fused LoRA) gives every part the whole down, its
    rows of up and the file's alpha. Either way each part's delta is the rows of the fused
    delta (a module with swapped halves has its rows put back in diffusers' order first). A
    missing alpha means alpha = rank. Modules of ``modules`` absent from the file are left out;
    a file module not in ``modules`` is a CheckpointError (``source`` names the file).
    """
    by_name = {module.name: module for module in modules}
    groups = _group(tensors, source)
    unknown = sorted(set(groups) - set(by_name))
    if unknown:
        raise CheckpointError(
            f"{source}: {len(unknown)} modules in the file are not LoRA modules of this model "
            f"and settings, e.g. {unknown[0]}"
        )
    weights: dict[str, LoraWeights] = {}
    for name in sorted(groups):
        parts = groups[name]
        for kind in (DOWN, UP):
            if kind not in parts:
                raise CheckpointError(f"{source}: {name} has no {kind} tensor")
        module = by_name[name]
        down, up = parts[DOWN], parts[UP]
        rank = down.shape[0] if down.dim() == 2 else -1
        if (
            down.dim() != 2
            or up.dim() != 2
            or down.shape[1] != module.in_features
            or up.shape != (sum(module.out_features), rank)
        ):
            raise CheckpointError(
                f"{source}: {name} has down {list(down.shape)} / up {list(up.shape)}, the model "
                f"needs [r, {module.in_features}] / [{sum(module.out_features)}, r]; the file was "
                "made for a different model"
            )
        alpha = float(parts[ALPHA].float().item()) if ALPHA in parts else float(rank)
        if module.swapped_halves:
            up = _swap_halves(up)
        weights.update(_split(module, down, up, alpha))
    return weights


def _is_block_diagonal(up: torch.Tensor, rows: tuple[int, ...]) -> bool:
    """Whether ``up`` is zero outside the diagonal blocks of equal part ranks."""
    count, total_rank = len(rows), up.shape[1]
    if total_rank % count:
        return False
    rank = total_rank // count
    row = 0
    for index, size in enumerate(rows):
        block = up[row : row + size]
        if block[:, : index * rank].any() or block[:, (index + 1) * rank :].any():
            return False
        row += size
    return True


def _split(
    module: KohyaModule, down: torch.Tensor, up: torch.Tensor, alpha: float
) -> dict[str, LoraWeights]:
    if not module.fused:
        return {module.parts[0]: (down, up, alpha)}
    rows = module.out_features
    starts = [sum(rows[:i]) for i in range(len(rows))]
    if _is_block_diagonal(up, rows):
        rank = up.shape[1] // len(rows)
        # Each block keeps the fused scale alpha / (n r), so its own alpha is alpha / n.
        return {
            path: (
                down[i * rank : (i + 1) * rank].contiguous(),
                up[start : start + size, i * rank : (i + 1) * rank].contiguous(),
                alpha / len(rows),
            )
            for i, (path, start, size) in enumerate(zip(module.parts, starts, rows, strict=True))
        }
    return {
        path: (down, up[start : start + size].contiguous(), alpha)
        for path, start, size in zip(module.parts, starts, rows, strict=True)
    }


def adapter_weights(model: nn.Module) -> dict[str, LoraWeights]:
    """(down, up, alpha) of every peft adapter of ``model`` (library.networks.lora), by path."""
    return {
        path: (
            layer.lora_A[ADAPTER].weight.detach(),
            layer.lora_B[ADAPTER].weight.detach(),
            float(layer.lora_alpha[ADAPTER]),
        )
        for path, layer in lora_layers(unwrap(model)).items()
    }


@torch.no_grad()
def load_adapter_weights(model: nn.Module, weights: Mapping[str, LoraWeights], source: str) -> None:
    """Copy (down, up, alpha) into ``model``'s adapters, which must exist with the same ranks.

    Everything is checked before anything is copied. ``source`` names the file in errors.
    """
    model = unwrap(model)
    layers = lora_layers(model)
    unknown = sorted(set(weights) - set(layers))
    if unknown:
        raise CheckpointError(f"{source}: {unknown[0]} has LoRA weights but no adapter")
    for path, (down, up, _) in weights.items():
        layer = layers[path]
        if (
            down.shape != layer.lora_A[ADAPTER].weight.shape
            or up.shape != layer.lora_B[ADAPTER].weight.shape
        ):
            raise CheckpointError(
                f"{source}: {path} has rank {down.shape[0]}, the adapter has rank "
                f"{lora_rank(layer)}; set network_dim = {down.shape[0]} (a dense fused kohya "
                "LoRA gives each part the whole rank)"
            )
    for path, (down, up, _) in weights.items():
        layer = layers[path]
        for target, value in (
            (layer.lora_A[ADAPTER].weight, down),
            (layer.lora_B[ADAPTER].weight, up),
        ):
            target.copy_(value.to(target.device, target.dtype))
    set_lora_scale(model, {path: alpha for path, (_, _, alpha) in weights.items()})
