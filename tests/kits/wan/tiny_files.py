"""The tiny Wan as the single files users have: the transformer in the original names
(Comfy-Org's wan2.1_t2v_1.3B_fp16.safetensors layout; ``comfy``: under
``model.diffusion_model.``), umT5's encoder in transformers' names (umt5_xxl_fp16.safetensors),
the VAE in Wan 2.1's names (wan_2.1_vae.safetensors) and the tokenizer folder. The tiny sizes
are not the releases' (the transformer's 8-wide heads do not show in its shapes), so each
file carries its exact config in the header, as difftune's own files do."""

from __future__ import annotations

from pathlib import Path

import torch

from library.models.families.name_table import CHECKPOINT_PREFIX
from library.models.families.wan.keys import TABLE, TABLE_CLIP
from library.models.wan_vae_keys import original_name, vae_to_original
from tests.kits.krea2.tiny_files import _save
from tests.kits.wan.tiny import (
    build_tiny_wan_components,
    build_tiny_wan_ti2v_components,
    clip_vision_config,
    text_encoder_config,
    transformer_config,
)
from tests.kits.wan.tiny_tokenizer import write_tiny_umt5_tokenizer


def write_tiny_wan_files(path, seed=0, dtype=torch.float32, comfy=False) -> dict[str, Path]:
    """Write the four under ``path``; returns their paths by part."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    modules = build_tiny_wan_components(seed)
    head = CHECKPOINT_PREFIX if comfy else ""
    original = {
        head + k: v for k, v in TABLE.to_original(modules["transformer"].state_dict()).items()
    }
    text = {k: v for k, v in modules["text_encoder"].state_dict().items()
            if k != "encoder.embed_tokens.weight"}  # fmt: skip
    vae = modules["vae"]
    return {
        "transformer": _save(original, path / "wan2.1_t2v.safetensors", dtype,
                             transformer_config(), "transformer"),
        "t5": _save(text, path / "umt5_xxl.safetensors", dtype, text_encoder_config(),
                    "text_encoder"),
        "vae": _save(vae_to_original(vae.state_dict(), vae.config), path / "wan_vae.safetensors",
                     dtype, dict(vae.config), "vae"),
        "tokenizer": write_tiny_umt5_tokenizer(path / "tokenizer"),
    }  # fmt: skip


def write_tiny_wan_expert_file(folder, sub: str, path, dtype=torch.float32) -> Path:
    """One expert of a tiny experts folder (``sub``: transformer or transformer_2) as its single
    file in the original names (Comfy-Org's wan2.2_{t2v,i2v}_{high,low}_noise_14B layout)."""
    from diffusers import WanTransformer3DModel

    module = WanTransformer3DModel.from_pretrained(Path(folder) / sub)
    original = TABLE.to_original(module.state_dict())
    config = {**transformer_config(), "in_channels": module.config.in_channels}  # I2V: 36
    return _save(original, Path(path), dtype, config, "transformer")


# transformers' UMT5EncoderModel stems -> Wan's T5 code's (Wan-AI's wan/modules/t5.py)
_WAN_T5 = {
    "layer.0.layer_norm": "norm1", "layer.1.layer_norm": "norm2",
    "layer.0.SelfAttention.relative_attention_bias": "pos_embedding.embedding",
    "layer.1.DenseReluDense.wi_0": "ffn.gate.0", "layer.1.DenseReluDense.wi_1": "ffn.fc1",
    "layer.1.DenseReluDense.wo": "ffn.fc2",
    **{f"layer.0.SelfAttention.{p}": f"attn.{p}" for p in "qkvo"},
}  # fmt: skip


def write_tiny_wan_t5_pth(path, seed=0, dtype=torch.bfloat16) -> Path:
    """The tiny umT5 encoder as Wan-AI's models_t5_umt5-xxl-enc-bf16.pth: a torch file of the
    encoder in the names of Wan's own T5 code."""
    state = build_tiny_wan_components(seed)["text_encoder"].state_dict()
    wan = {"token_embedding.weight": state["shared.weight"],
           "norm.weight": state["encoder.final_layer_norm.weight"]}  # fmt: skip
    for key, tensor in state.items():
        if key.startswith("encoder.block."):
            _, _, index, rest = key.split(".", 3)
            stem, _ = rest.rsplit(".", 1)
            wan[f"blocks.{index}.{_WAN_T5[stem]}.weight"] = tensor
    path = Path(path)
    torch.save({k: v.to(dtype) for k, v in wan.items()}, path)
    return path


def wan22_vae_original(state: dict, num_res_blocks: int) -> dict:
    """AutoencoderKLWan (is_residual) tensors in the names of Wan-AI's vae2_2.py, as Wan2.2_VAE.pth
    and Comfy-Org's wan2.2_vae.safetensors hold them: each level's residual blocks, then its
    resample, numbered in one list under the level (encoder ``downsamples.<i>.downsamples.<j>``,
    decoder ``upsamples.<i>.upsamples.<j>``), written here from that layout; the keys outside the
    levels are named as in Wan 2.1 (wan_vae_keys, tested on its own)."""
    residual = {"norm1.": "residual.0.", "conv1.": "residual.2.", "norm2.": "residual.3.",
                "conv2.": "residual.6.", "conv_shortcut.": "shortcut."}  # fmt: skip
    out = {}
    for key, tensor in state.items():
        parts = key.split(".")
        if parts[1] not in ("down_blocks", "up_blocks"):
            out[original_name(key, num_res_blocks)] = tensor
            continue
        side, level, kind = parts[0], parts[2], parts[3]
        way = "down" if side == "encoder" else "up"
        if kind == "resnets":
            rest = ".".join(parts[5:])
            stem = next(theirs for ours, theirs in residual.items() if rest.startswith(ours))
            name = f"{parts[4]}.{stem}{rest.split('.', 1)[1]}"
        else:  # the resample after the level's residual blocks (one more in a decoder level)
            name = f"{num_res_blocks + (way == 'up')}.{'.'.join(parts[4:])}"
        out[f"{side}.{way}samples.{level}.{way}samples.{name}"] = tensor
    return out


def write_tiny_wan_ti2v_files(path, seed=0, dtype=torch.float32, comfy=False) -> dict[str, Path]:
    """The tiny TI2V-5B (tiny.build_tiny_wan_ti2v_components, the modules of
    tiny.write_tiny_wan_ti2v_folder) as Comfy-Org's wan2.2_ti2v_5B_fp16.safetensors and
    wan2.2_vae.safetensors (the original names; ``comfy``: the transformer under
    ``model.diffusion_model.``), beside the umT5 file and tokenizer; their paths by part."""
    path = Path(path)
    files = write_tiny_wan_files(path, seed)
    modules = build_tiny_wan_ti2v_components(seed)
    transformer, vae = modules["transformer"], modules["vae"]
    head = CHECKPOINT_PREFIX if comfy else ""
    original = {head + k: v for k, v in TABLE.to_original(transformer.state_dict()).items()}
    vae_state = wan22_vae_original(vae.state_dict(), vae.config.num_res_blocks)
    return files | {
        "transformer": _save(original, path / "wan2.2_ti2v_5B.safetensors", dtype,
                             _config(transformer), "transformer"),
        "vae": _save(vae_state, path / "wan2.2_vae.safetensors", dtype, _config(vae), "vae"),
    }  # fmt: skip


def _config(module) -> dict:
    return {k: v for k, v in module.config.items() if not k.startswith("_")}


def write_tiny_wan_i2v_clip_files(folder, path, dtype=torch.float32) -> dict[str, Path]:
    """A tiny Wan 2.1 I2V-14B folder's transformer in the original names (Comfy-Org's
    wan2.1_i2v_480p_14B layout: img_emb, cross_attn.k_img / v_img / norm_k_img) and its CLIP
    vision tower as Comfy-Org's clip_vision_h.safetensors holds one (transformers' names with
    the projection of CLIPVisionModelWithProjection), beside write_tiny_wan_files' others."""
    from diffusers import WanTransformer3DModel
    from transformers import CLIPVisionModel

    folder, path = Path(folder), Path(path)
    files = write_tiny_wan_files(path)
    transformer = WanTransformer3DModel.from_pretrained(folder / "transformer")
    vision = CLIPVisionModel.from_pretrained(folder / "image_encoder")
    config = vision.config
    projection = torch.randn(config.projection_dim, config.hidden_size)
    state = {f"vision_model.{k}": v for k, v in vision.state_dict().items()}
    state["visual_projection.weight"] = projection
    return files | {
        "transformer": _save(TABLE_CLIP.to_original(transformer.state_dict()),
                             path / "wan2.1_i2v_480p_14B.safetensors", dtype,
                             _config(transformer), "transformer"),
        "clip": _save(state, path / "clip_vision_h.safetensors", dtype, clip_vision_config(),
                      "image_encoder"),
    }  # fmt: skip


def write_tiny_wan_clip_pth(folder, path) -> Path:
    """A tiny Wan 2.1 I2V-14B folder's CLIP vision tower as Wan-AI ship theirs
    (models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth): a torch file of the whole CLIP in
    the names of Wan's own code (wan/modules/clip.py), its visual tower's q, k and v fused in one
    to_qkv, beside a text tower and a pooling head (stand-ins of their shapes)."""
    from transformers import CLIPVisionModel

    state = CLIPVisionModel.from_pretrained(Path(folder) / "image_encoder").state_dict()
    width = state["embeddings.class_embedding"].shape[0]
    wan = {
        "visual.patch_embedding.weight": state["embeddings.patch_embedding.weight"],
        "visual.cls_embedding": state["embeddings.class_embedding"].view(1, 1, -1),
        "visual.pos_embedding": state["embeddings.position_embedding.weight"][None],
        "visual.head": torch.randn(width, 8), "textual.token_embedding.weight": torch.randn(4, 8),
        "log_scale": torch.tensor(2.6),
    }  # fmt: skip
    for ours, theirs in (("pre_norm", "pre_layrnorm"), ("post_norm", "post_layernorm")):
        for p in ("weight", "bias"):
            wan[f"visual.{ours}.{p}"] = state[f"{theirs}.{p}"]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layers."))
    for i in range(layers):
        head = f"encoder.layers.{i}"
        for p in ("weight", "bias"):
            wan[f"visual.transformer.{i}.attn.to_qkv.{p}"] = torch.cat(
                [state[f"{head}.self_attn.{q}_proj.{p}"] for q in "qkv"])
            for ours, theirs in (("norm1", "layer_norm1"), ("norm2", "layer_norm2"),
                                 ("attn.proj", "self_attn.out_proj"), ("mlp.0", "mlp.fc1"),
                                 ("mlp.2", "mlp.fc2")):  # fmt: skip
                wan[f"visual.transformer.{i}.{ours}.{p}"] = state[f"{head}.{theirs}.{p}"]
    torch.save(wan, str(path))
    return Path(path)
