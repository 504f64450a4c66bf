"""The one name table between Z-Image's single-file transformer checkpoints and diffusers.

Single-file Z-Image transformers (the Comfy-Org split files, ComfyUI saves, community merges)
use the original NextDiT module names; diffusers' ``ZImageTransformer2DModel`` renamed a few.
The differences, as diffusers' ``convert_z_image_transformer_checkpoint_to_diffusers`` applies
them (and its Z-Image LoRA converter relies on):

=====================================================  ============================================
original                                                diffusers
=====================================================  ============================================
``x_embedder.{weight,bias}``                            ``all_x_embedder.2-1.{weight,bias}``
``final_layer.<rest>``                                  ``all_final_layer.2-1.<rest>``
``<block>.attention.qkv.weight`` (q, k, v stacked)      ``<block>.attention.to_{q,k,v}.weight``
``<block>.attention.out.weight``                        ``<block>.attention.to_out.0.weight``
``<block>.attention.q_norm.weight``                     ``<block>.attention.norm_q.weight``
``<block>.attention.k_norm.weight``                     ``<block>.attention.norm_k.weight``
``norm_final.weight``                                   (none: an unused norm of the original code)
=====================================================  ============================================

``<block>`` is ``layers.<i>``, ``noise_refiner.<i>`` or ``context_refiner.<i>``; every other
name (adaLN_modulation, feed_forward.w1/w2/w3, the four RMS norms per block, t_embedder,
cap_embedder, x_pad_token, cap_pad_token) is the same on both sides. "2-1" is the (patch size,
frame patch size) pair of the released model. The fused qkv weight is [3 * dim, dim] with q, k
and v in that order along the rows (n_kv_heads = n_heads, so the three parts are equal). Full
checkpoints prefix the transformer's keys with ``model.diffusion_model.``; standalone
transformer files carry none.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

CHECKPOINT_PREFIX = "model.diffusion_model."  # the transformer's keys inside a full checkpoint
PATCH_KEY = "2-1"  # f"{patch_size}-{f_patch_size}" of all_x_embedder / all_final_layer
BLOCK_GROUPS = ("layers", "noise_refiner", "context_refiner")
# The original code's top-level norm_final (an RMSNorm it never calls): present in some files,
# dropped on the way in, not written on the way out.
DROPPED = ("norm_final.weight",)

# original key start -> diffusers key start, for the two patch-size-specific top-level modules
TOP_LEVEL = (
    ("x_embedder.", f"all_x_embedder.{PATCH_KEY}."),
    ("final_layer.", f"all_final_layer.{PATCH_KEY}."),
)
# original name -> diffusers name, inside a block (after "<group>.<i>.")
IN_BLOCK = (
    ("attention.out.weight", "attention.to_out.0.weight"),
    ("attention.q_norm.weight", "attention.norm_q.weight"),
    ("attention.k_norm.weight", "attention.norm_k.weight"),
)
FUSED_QKV = "attention.qkv.weight"
SPLIT_QKV = ("attention.to_q.weight", "attention.to_k.weight", "attention.to_v.weight")


def _split_block(key: str) -> tuple[str, str] | None:
    """("<group>.<i>.", rest) for a key inside a block, else None."""
    parts = key.split(".", 2)
    if len(parts) == 3 and parts[0] in BLOCK_GROUPS and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}.", parts[2]
    return None


def diffusers_names(original: str) -> tuple[str, ...]:
    """The diffusers key(s) an original key (without prefix) becomes: three for a fused qkv,
    none for a dropped key, else one."""
    if original in DROPPED:
        return ()
    for old, new in TOP_LEVEL:
        if original.startswith(old):
            return (new + original[len(old) :],)
    block = _split_block(original)
    if block is not None:
        head, rest = block
        if rest == FUSED_QKV:
            return tuple(head + name for name in SPLIT_QKV)
        for old, new in IN_BLOCK:
            if rest == old:
                return (head + new,)
    return (original,)


def original_name(diffusers: str) -> str:
    """The original key (without prefix) holding a diffusers key; q, k and v all map to the
    fused ``attention.qkv.weight`` (diffusers_names gives the order)."""
    for old, new in TOP_LEVEL:
        if diffusers.startswith(new):
            return old + diffusers[len(new) :]
    block = _split_block(diffusers)
    if block is not None:
        head, rest = block
        if rest in SPLIT_QKV:
            return head + FUSED_QKV
        for old, new in IN_BLOCK:
            if rest == new:
                return head + old
    return diffusers


def strip_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The transformer's keys without CHECKPOINT_PREFIX, when every key has it (a full
    checkpoint's transformer part); otherwise the keys as they are."""
    keys = list(state_dict)
    if keys and all(k.startswith(CHECKPOINT_PREFIX) for k in keys):
        return {k[len(CHECKPOINT_PREFIX) :]: v for k, v in state_dict.items()}
    return dict(state_dict)


def original_to_diffusers(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An original-layout transformer state dict (prefixed or not) in diffusers' names.

    The fused qkv weight is cut into three equal row blocks (views of the original tensor).
    """
    out: dict[str, torch.Tensor] = {}
    for key, tensor in strip_prefix(state_dict).items():
        names = diffusers_names(key)
        if len(names) == 3:
            if tensor.shape[0] % 3:
                raise ValueError(f"{key}: {tuple(tensor.shape)} does not split into q, k and v")
            out.update(zip(names, torch.chunk(tensor, 3, dim=0), strict=True))
        elif names:
            out[names[0]] = tensor
    return out


def diffusers_to_original(
    state_dict: Mapping[str, torch.Tensor], prefix: str = ""
) -> dict[str, torch.Tensor]:
    """A diffusers transformer state dict in the original names (keys start with ``prefix``:
    "" for a standalone transformer file, CHECKPOINT_PREFIX inside a full checkpoint).

    q, k and v are concatenated into the fused qkv weight in that order; all three must be there.
    """
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        name = original_name(key)
        if name.endswith(FUSED_QKV) and name != key:
            fused.setdefault(name, {})[key] = tensor
        else:
            out[prefix + name] = tensor
    for name, parts in fused.items():
        order = diffusers_names(name)
        missing = [k for k in order if k not in parts]
        if missing:
            raise KeyError(f"{name} needs {', '.join(missing)} as well")
        out[prefix + name] = torch.cat([parts[k] for k in order], dim=0)
    return out
