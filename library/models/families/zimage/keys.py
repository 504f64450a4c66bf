"""The one name table between Z-Image's single-file transformer checkpoints and diffusers.

Single-file Z-Image transformers (the Comfy-Org split files, ComfyUI saves, community merges)
use the original NextDiT module names; diffusers' ``ZImageTransformer2DModel`` renamed a few.
The differences, as diffusers' ``convert_z_image_transformer_checkpoint_to_diffusers`` applies
them (and its Z-Image LoRA converter relies on), as a name table (families/name_table.py):

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

from library.models.families.name_table import CHECKPOINT_PREFIX, NameTable

PATCH_KEY = "2-1"  # f"{patch_size}-{f_patch_size}" of all_x_embedder / all_final_layer
BLOCK_GROUPS = ("layers", "noise_refiner", "context_refiner")
# The original code's top-level norm_final (an RMSNorm it never calls): present in some files,
# dropped on the way in, not written on the way out.
DROPPED = ("norm_final.weight",)
FUSED_QKV = "attention.qkv.weight"
_BLOCK = {
    "attention.qkv.weight": (
        "attention.to_q.weight",
        "attention.to_k.weight",
        "attention.to_v.weight",
    ),
    "attention.out.weight": "attention.to_out.0.weight",
    "attention.q_norm.weight": "attention.norm_q.weight",
    "attention.k_norm.weight": "attention.norm_k.weight",
}
TABLE = NameTable(
    top={
        "x_embedder": f"all_x_embedder.{PATCH_KEY}",
        "final_layer.linear": f"all_final_layer.{PATCH_KEY}.linear",
        "final_layer.adaLN_modulation.1": f"all_final_layer.{PATCH_KEY}.adaLN_modulation.1",
    },
    lists=tuple((group, group, _BLOCK) for group in BLOCK_GROUPS),
    model="ZImageTransformer2DModel",
    same_elsewhere=True,
)


def diffusers_names(original: str) -> tuple[str, ...]:
    """The diffusers key(s) an original key (without prefix) becomes: three for a fused qkv,
    none for a dropped key, else one."""
    return () if original in DROPPED else TABLE.diffusers_keys(original)


def original_name(diffusers: str) -> str:
    """The original key (without prefix) holding a diffusers key; q, k and v all map to the
    fused ``attention.qkv.weight`` (diffusers_names gives the order)."""
    return TABLE.original_key(diffusers)


def original_to_diffusers(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An original-layout transformer state dict (prefixed or not) in diffusers' names; the
    fused qkv weight is cut into three equal row blocks (views of the original tensor)."""
    dropped = {CHECKPOINT_PREFIX + k for k in DROPPED} | set(DROPPED)
    return TABLE.from_original({k: v for k, v in state_dict.items() if k not in dropped})


def diffusers_to_original(
    state_dict: Mapping[str, torch.Tensor], prefix: str = ""
) -> dict[str, torch.Tensor]:
    """A diffusers transformer state dict in the original names (keys start with ``prefix``:
    "" for a standalone transformer file, CHECKPOINT_PREFIX inside a full checkpoint); q, k and
    v are concatenated into the fused qkv weight in that order, all three must be there."""
    try:
        original = TABLE.to_original(state_dict)
    except ValueError as exc:
        fused = {original_name(k) for k in state_dict if k.endswith(_BLOCK[FUSED_QKV])}
        missing = [t for name in fused for t in diffusers_names(name) if t not in state_dict]
        raise KeyError(f"{exc}: {', '.join(missing)} as well") from None
    return {prefix + k: v for k, v in original.items()}
