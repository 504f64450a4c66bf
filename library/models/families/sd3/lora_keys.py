"""LoRA names for SD3 / SD3.5 (diffusers' SD3Transformer2DModel, CLIP-L, CLIP-G, T5-XXL).

Two layouts are written and read:

- kohya's (``networks.lora_sd3``; ComfyUI reads it): ``lora_unet_`` + the module's path in the
  original Stability AI MMDiT with dots as underscores, e.g.
  ``lora_unet_joint_blocks_0_context_block_attn_qkv``. kohya adapts every Linear inside each
  ``SingleDiTBlock`` (``joint_blocks.{i}.x_block`` and ``.context_block``): ``attn.qkv`` (q, k
  and v fused), ``attn.proj``, ``attn2.qkv`` / ``attn2.proj`` (SD3.5 Medium's dual-attention
  blocks), ``mlp.fc1``, ``mlp.fc2`` and ``adaLN_modulation.1``. The last block's context_block
  is pre-only: only ``attn.qkv`` and ``adaLN_modulation.1``, whose two output halves (shift,
  scale) diffusers stores swapped (``norm1_context`` is an AdaLayerNormContinuous, which reads
  scale first); its up weight's rows are swapped in halves on export and back on import. The
  fused modules and the swap are library/networks/fused_keys.py's. Text encoders:
  ``lora_te1_`` CLIP-L, ``lora_te2_`` CLIP-G, ``lora_te3_`` T5-XXL (only with train_t5xxl),
  kohya's plain names of the transformers 4 paths.
- diffusers' (``StableDiffusion3Pipeline.load_lora_weights``; ComfyUI reads it too): peft's
  ``<component>.<module path>.lora_A.weight`` ([r, in]) / ``.lora_B.weight`` ([out, r]) per
  diffusers Linear, components ``transformer``, ``text_encoder`` (CLIP-L) and
  ``text_encoder_2`` (CLIP-G). The layout has no alpha tensors: readers apply ``B @ A`` at
  scale 1, so :func:`diffusers_lora_tensors` folds each adapter's ``alpha / r`` into its B
  (``lora_B = alpha / r * up``) and :func:`import_diffusers_lora` reads alpha = r unless
  diffusers' ``lora_adapter_metadata`` header (what its save_lora_weights writes) gives
  lora_alpha (library/networks/peft_metadata.py). It has no T5
  component (diffusers' SD3 loader adapts the transformer and the two CLIPs only), so T5
  adapters (train_t5xxl) cannot be written in it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch
from torch import nn

from library.errors import CheckpointError
from library.networks.fused_keys import (
    KohyaModule,
    LoraWeights,
    adapter_weights,
    export_lora,
    import_lora,
    kohya_module,
    linears_inside,
    load_adapter_weights,
    target_paths,
    text_encoder_modules,
)
from library.networks.kohya_names import kohya_name, kohya_path, unwrap
from library.networks.peft_metadata import PeftConfig, peft_configs

__all__ = [
    "CLIP_G",
    "CLIP_L",
    "DIFFUSERS_COMPONENTS",
    "T5",
    "TRANSFORMER",
    "KohyaModule",
    "LoraWeights",
    "adapter_weights",
    "diffusers_lora_tensors",
    "embedder_modules",
    "export_lora",
    "import_diffusers_lora",
    "import_lora",
    "is_diffusers_layout",
    "load_adapter_weights",
    "target_paths",
    "text_encoder_modules",
    "transformer_modules",
]

TRANSFORMER = "lora_unet"
CLIP_L = "lora_te1"
CLIP_G = "lora_te2"
T5 = "lora_te3"

# kohya prefix -> the component name of diffusers' SD3 LoRA layout (SD3LoraLoaderMixin).
DIFFUSERS_COMPONENTS = {
    TRANSFORMER: "transformer",
    CLIP_L: "text_encoder",
    CLIP_G: "text_encoder_2",
}
_LORA_A, _LORA_B = "lora_A.weight", "lora_B.weight"

# Original path inside joint_blocks.{i}.context_block / .x_block -> diffusers paths inside
# transformer_blocks.{i}, in the order nn.Module.named_modules visits kohya's SingleDiTBlock
# (attn, attn2, mlp, adaLN_modulation: the order kohya creates its modules). Fused parts are
# listed in the order of the fused weight's rows (q, k, v).
_CONTEXT_BLOCK = (
    ("attn.qkv", ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")),
    ("attn.proj", ("attn.to_add_out",)),
    ("mlp.fc1", ("ff_context.net.0.proj",)),
    ("mlp.fc2", ("ff_context.net.2",)),
    ("adaLN_modulation.1", ("norm1_context.linear",)),
)
_X_BLOCK = (
    ("attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
    ("attn.proj", ("attn.to_out.0",)),
    ("attn2.qkv", ("attn2.to_q", "attn2.to_k", "attn2.to_v")),
    ("attn2.proj", ("attn2.to_out.0",)),
    ("mlp.fc1", ("ff.net.0.proj",)),
    ("mlp.fc2", ("ff.net.2",)),
    ("adaLN_modulation.1", ("norm1.linear",)),
)
# A pre-only context block (the last joint block) has only these; attn2 exists only in SD3.5
# Medium's dual-attention blocks (x_block_self_attn_layers / dual_attention_layers).
_PRE_ONLY = {"attn.qkv", "adaLN_modulation.1"}
_DUAL = {"attn2.qkv", "attn2.proj"}
_MODULATION = "adaLN_modulation.1"


def transformer_modules(
    transformer: nn.Module,
    *,
    modulation: bool = True,
    block_indices: Collection[int] | None = None,
) -> list[KohyaModule]:
    """The kohya modules of an SD3Transformer2DModel, in kohya's order.

    The defaults are kohya's: every Linear of both SingleDiTBlocks of every joint block, the
    context block before the x block: 23 x 10 + 7 = 237 modules for SD3 Medium, 263 for SD3.5
    Medium (13 dual-attention blocks add attn2.qkv and attn2.proj), 37 x 10 + 7 = 377 for SD3.5
    Large.
    ``modulation=False`` leaves out the adaLN_modulation Linears (kohya's context_mod_dim=0
    and x_mod_dim=0); ``block_indices`` keeps only those joint blocks (kohya's
    train_block_indices). The pre-only block's context modulation has ``swapped_halves``.
    Works on a model on the meta device.
    """
    transformer = unwrap(transformer)
    modules: list[KohyaModule] = []
    for index, block in enumerate(transformer.get_submodule("transformer_blocks")):
        if block_indices is not None and index not in block_indices:
            continue
        pre_only = bool(block.context_pre_only)
        dual = bool(block.use_dual_attention)
        # diffusers' AdaLayerNormContinuous chunks its output (scale, shift); the original
        # pre-only context block's adaLN_modulation gives (shift, scale).
        context_swapped = type(block.norm1_context).__name__ == "AdaLayerNormContinuous"
        for stream, layout in (("context_block", _CONTEXT_BLOCK), ("x_block", _X_BLOCK)):
            for original, parts in layout:
                if stream == "context_block" and pre_only and original not in _PRE_ONLY:
                    continue
                if stream == "x_block" and not dual and original in _DUAL:
                    continue
                if not modulation and original == _MODULATION:
                    continue
                swapped = stream == "context_block" and original == _MODULATION
                modules.append(
                    kohya_module(
                        transformer,
                        TRANSFORMER,
                        f"joint_blocks.{index}.{stream}.{original}",
                        (f"transformer_blocks.{index}.{part}" for part in parts),
                        swapped_halves=swapped and context_swapped,
                    )
                )
    return modules


# -- diffusers' layout -----------------------------------------------------------------------


# Layers of the original MMDiT outside the joint blocks that LyCORIS' class list catches (its
# PatchEmbed and TimestepEmbedding classes): original path -> diffusers path.
_TIMESTEP_MLP = (
    ("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1"),
    ("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2"),
)
_PATCH_CONV = ("x_embedder.proj", "pos_embed.proj")


def embedder_modules(transformer: nn.Module, *, conv: bool) -> list[KohyaModule]:
    """The timestep MLP's two Linears (``lora_unet_t_embedder_mlp_0`` / ``_2``) and, with
    ``conv``, the patch-embedding conv (``lora_unet_x_embedder_proj``), one-to-one."""
    transformer = unwrap(transformer)
    modules = [
        kohya_module(transformer, TRANSFORMER, original, (path,)) for original, path in _TIMESTEP_MLP
    ]
    if conv:
        original, path = _PATCH_CONV
        layer = transformer.get_submodule(path)
        layer = getattr(layer, "base_layer", layer)
        modules.append(
            KohyaModule(
                name=kohya_name(TRANSFORMER, original),
                original=original,
                parts=(path,),
                in_features=layer.in_channels,
                out_features=(layer.out_channels,),
            )
        )
    return modules


def _component(prefix: str) -> str:
    prefix = prefix.rstrip("_")
    if prefix == T5:
        raise ValueError(
            "T5-XXL adapters (train_t5xxl) cannot be written in diffusers' SD3 LoRA layout: "
            "StableDiffusion3Pipeline loads LoRA weights into the transformer and the two CLIP "
            "text encoders only; set train_t5xxl = false or save in kohya's layout"
        )
    if prefix not in DIFFUSERS_COMPONENTS:
        raise ValueError(
            f"{prefix!r} is not an SD3 LoRA prefix ({', '.join(DIFFUSERS_COMPONENTS)})"
        )
    return DIFFUSERS_COMPONENTS[prefix]


def _key_path(prefix: str, model: nn.Module, path: str) -> str:
    """The module path diffusers' layout names ``path`` by: the transformer's own; a CLIP's
    transformers 4 path (``text_model.encoder...``), as diffusers and ComfyUI key them."""
    return path if prefix == TRANSFORMER else kohya_path(model, path)


def diffusers_lora_tensors(models: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
    """Every adapter of ``models`` (kohya prefix -> model) in diffusers' SD3 LoRA layout.

    ``transformer.<path>.lora_A.weight`` is the down weight, ``.lora_B.weight`` the up weight
    times the adapter's scale ``alpha / r`` (the layout has no alphas; readers use scale 1),
    in the up weight's dtype. CLIP-L (``lora_te1``) is ``text_encoder.``, CLIP-G (``lora_te2``)
    ``text_encoder_2.``. A T5 (``lora_te3``) in ``models`` is a ValueError naming train_t5xxl.
    """
    components = {prefix.rstrip("_"): _component(prefix) for prefix in models}
    tensors: dict[str, torch.Tensor] = {}
    for prefix, model in models.items():
        prefix = prefix.rstrip("_")
        plain = unwrap(model)
        for path, (down, up, alpha) in adapter_weights(plain).items():
            key = f"{components[prefix]}.{_key_path(prefix, plain, path)}"
            scale = float(alpha) / down.shape[0]
            tensors[f"{key}.{_LORA_A}"] = down.detach().clone()
            tensors[f"{key}.{_LORA_B}"] = (up.detach().float() * scale).to(up.dtype)
    return tensors


def is_diffusers_layout(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether a LoRA state dict is in diffusers' layout (component-prefixed peft keys) rather
    than kohya's (``lora_unet_...``, ``lora_te1_...``)."""
    starts = tuple(f"{component}." for component in DIFFUSERS_COMPONENTS.values())
    return any(key.startswith(starts) for key in tensors)


def import_diffusers_lora(
    models: Mapping[str, nn.Module],
    tensors: Mapping[str, torch.Tensor],
    source: str,
    metadata: Mapping[str, str] | None = None,
) -> dict[str, dict[str, LoraWeights]]:
    """Per-model, per-path (down, up, alpha) of a diffusers-layout SD3 LoRA state dict.

    ``models`` maps kohya prefix -> model (adapted or not); the result has one entry per prefix
    the file has weights for, ready for :func:`load_adapter_weights`. Each module's alpha is
    the one diffusers' ``lora_adapter_metadata`` header in ``metadata`` gives it, else its rank
    (scale 1, the layout's convention; ours folded alpha / r into lora_B). Any other
    key, a component that is not being trained (or not an SD3 one), a module the model lacks
    or has as no Linear, a missing A or B, or shapes that do not fit the Linear are a
    CheckpointError naming ``source``. Modules the file leaves out are left out.
    """
    by_component = {}
    for prefix, model in models.items():
        prefix = prefix.rstrip("_")
        if prefix == T5:
            continue  # no T5 in this layout; a file cannot name it
        by_component[_component(prefix)] = (prefix, unwrap(model))
    pairs: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        component, _, rest = key.partition(".")
        module_path, kind = None, None
        for suffix in (_LORA_A, _LORA_B):
            if rest.endswith(f".{suffix}"):
                module_path, kind = rest[: -len(suffix) - 1], suffix
        if kind is None or not module_path:
            raise CheckpointError(
                f"{source}: unexpected key {key!r} (not a diffusers/peft LoRA tensor: "
                "<component>.<module>.lora_A.weight / lora_B.weight)"
            )
        if component not in by_component:
            raise CheckpointError(_component_error(component, key, source))
        pairs.setdefault((component, module_path), {})[kind] = tensor
    linears = {
        component: _key_paths(prefix, model) for component, (prefix, model) in by_component.items()
    }
    configs = peft_configs(metadata, source)
    weights: dict[str, dict[str, LoraWeights]] = {}
    for (component, module_path), pair in sorted(pairs.items()):
        prefix, model = by_component[component]
        name = f"{component}.{module_path}"
        path = linears[component].get(module_path)
        if path is None:
            raise CheckpointError(
                f"{source}: {name} is not a Linear of this model's {component}; the file was "
                "made for a different model"
            )
        for kind in (_LORA_A, _LORA_B):
            if kind not in pair:
                raise CheckpointError(f"{source}: {name} has no {kind} tensor")
        linear = model.get_submodule(path)
        linear = getattr(linear, "base_layer", linear)
        down, up = pair[_LORA_A], pair[_LORA_B]
        rank = down.shape[0] if down.dim() == 2 else -1
        if (
            down.dim() != 2
            or up.dim() != 2
            or down.shape[1] != linear.in_features
            or up.shape != (linear.out_features, rank)
        ):
            raise CheckpointError(
                f"{source}: {name} has lora_A {list(down.shape)} / lora_B {list(up.shape)}, the "
                f"model needs [r, {linear.in_features}] / [{linear.out_features}, r]; the file "
                "was made for a different model"
            )
        alpha = configs.get(component, PeftConfig()).alpha(module_path, rank)
        weights.setdefault(prefix, {})[path] = (down, up, alpha)
    return weights


def _key_paths(prefix: str, model: nn.Module) -> dict[str, str]:
    """Layout path -> module path of every Linear of ``model`` (a peft wrapper is its Linear)."""
    return {_key_path(prefix, model, path): path for path in linears_inside(model)}


def _component_error(component: str, key: str, source: str) -> str:
    untrained = {
        "transformer": ("the transformer", "set network_train_text_encoder_only = false"),
        "text_encoder": ("CLIP-L", "set network_train_unet_only = false"),
        "text_encoder_2": ("CLIP-G", "set network_train_unet_only = false"),
    }
    if component in untrained:
        what, fix = untrained[component]
        return (
            f"{source}: has LoRA weights for {what} (e.g. {key}) but {what} is not being "
            f"trained; {fix}, or use a file without them"
        )
    return (
        f"{source}: {key!r} is for {component!r}, not a component of diffusers' SD3 LoRA layout "
        f"({', '.join(DIFFUSERS_COMPONENTS.values())}); the file was made for another model"
    )
