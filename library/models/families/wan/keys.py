"""Wan's transformer in its original names (Wan-AI's diffusion_pytorch_model*.safetensors of the
non-diffusers repositories, Comfy-Org's repackaged wan2.1_t2v_*.safetensors, bare or under
``model.diffusion_model.``) <-> diffusers' WanTransformer3DModel, as one name table. Each
diffusers Linear is one original Linear; the original's cross-attention norm ``norm3`` is
diffusers' ``norm2`` (the other two norms have no weights); the modulation tables are whole
keys. kohya / musubi-tuner LoRA modules are the ten Linears of every block, in this order
(musubi-tuner's Wan network, the layout diffusers' musubi converter reads)."""

from __future__ import annotations

from library.models.families.name_table import NameTable

_ATTENTION = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0"}
_BLOCK = {
    **{f"self_attn.{o}": f"attn1.{d}" for o, d in _ATTENTION.items()},
    **{f"cross_attn.{o}": f"attn2.{d}" for o, d in _ATTENTION.items()},
    "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2",
    "self_attn.norm_q.weight": "attn1.norm_q.weight",
    "self_attn.norm_k.weight": "attn1.norm_k.weight",
    "cross_attn.norm_q.weight": "attn2.norm_q.weight",
    "cross_attn.norm_k.weight": "attn2.norm_k.weight",
    "norm3.weight": "norm2.weight", "norm3.bias": "norm2.bias",
    "modulation": "scale_shift_table",
}  # fmt: skip
_TOP = {
        "patch_embedding": "patch_embedding",
        "text_embedding.0": "condition_embedder.text_embedder.linear_1",
        "text_embedding.2": "condition_embedder.text_embedder.linear_2",
        "time_embedding.0": "condition_embedder.time_embedder.linear_1",
        "time_embedding.2": "condition_embedder.time_embedder.linear_2",
        "time_projection.1": "condition_embedder.time_proj",
        "head.head": "proj_out",
        "head.modulation": "scale_shift_table",
}  # fmt: skip
_IMAGE_TOP = {
    **{f"img_emb.proj.{o}.{p}": f"condition_embedder.image_embedder.{d}.{p}"
       for o, d in (("0", "norm1"), ("4", "norm2")) for p in ("weight", "bias")},
    "img_emb.proj.1": "condition_embedder.image_embedder.ff.net.0.proj",
    "img_emb.proj.3": "condition_embedder.image_embedder.ff.net.2",
}  # fmt: skip
_IMAGE_BLOCK = {"cross_attn.k_img": "attn2.add_k_proj", "cross_attn.v_img": "attn2.add_v_proj",
                "cross_attn.norm_k_img.weight": "attn2.norm_added_k.weight"}  # fmt: skip


def _table(top: dict, block: dict) -> NameTable:
    return NameTable(
        top=top, lists=(("blocks", "blocks", block),), model="WanTransformer3DModel",
        width_key="patch_embedding.weight", whole=("modulation", "head.modulation"),
    )  # fmt: skip


TABLE = _table(_TOP, _BLOCK)
# the image Linears after the cross-attention's four, as musubi-tuner's blocks order them
_CLIP_BLOCK = dict(list(_BLOCK.items())[:8]) | _IMAGE_BLOCK | dict(list(_BLOCK.items())[8:])
TABLE_CLIP = _table(_TOP | _IMAGE_TOP, _CLIP_BLOCK)
state_to_original = TABLE_CLIP.to_original  # ToolFacts.to_original (T2V states alike)
