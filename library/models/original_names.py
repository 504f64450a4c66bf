"""Diffusers names <-> the original Stability names (LDM for SD 1.x/2.x, SGM for SDXL).

The one place that knows both layouts. Paths are dotted module paths or state-dict keys; every
mapping here works on either, because it rewrites a prefix and keeps the rest
(``"down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k"`` <->
``"input_blocks.4.1.transformer_blocks.0.attn2.to_k"`` for SDXL, with or without ``.weight``).

- UNet: ``unet_path_to_original(path, unet_config)`` / ``unet_path_from_original(...)``; the
  numbering of ``input_blocks``/``output_blocks`` follows from the config (layers per block,
  number of levels, which levels have attention), see ``UNetLayout``. SD 1.x/2.x (LDM) and SDXL
  (SGM) share this layout; ``model.diffusion_model.`` is the prefix in a checkpoint file.
- VAE: ``vae_key_to_original`` / ``vae_key_from_original`` and the state-dict converters, which
  also reshape the attention weights (Linear [C, C] in diffusers, 1x1 conv [C, C, 1, 1] there).
- Text encoders: OpenAI CLIP keeps the transformers names under ``text_model.``; OpenCLIP (SD 2.x,
  SDXL's second encoder) uses its own names with fused q/k/v, see ``openclip_from_hf`` and
  ``hf_from_openclip``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."

# ResNet sub-modules: diffusers name -> original name (the same in LDM and SGM).
_RESNET = {
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "time_emb_proj": "emb_layers.1",
    "conv_shortcut": "skip_connection",
}
_UNET_TOP = {
    "conv_in": "input_blocks.0.0",
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
}
# The label embedding is add_embedding (SDXL's size/pooled conditioning) or class_embedding.
_LABEL = {"linear_1": "label_emb.0.0", "linear_2": "label_emb.0.2"}


@dataclass(frozen=True)
class UNetLayout:
    """What fixes the original block numbering of a UNet2DConditionModel."""

    layers_per_block: int
    down_attention: tuple[bool, ...]  # per level, diffusers down_blocks order
    up_attention: tuple[bool, ...]  # per level, diffusers up_blocks order
    mid_attention: bool = True
    label_embedding: str = "add_embedding"  # or "class_embedding"

    @classmethod
    def from_config(cls, config: Mapping | UNetLayout) -> UNetLayout:
        """The layout of a diffusers UNet config (a dict, or a model's ``.config``)."""
        if isinstance(config, UNetLayout):
            return config
        per_block = config.get("layers_per_block", 2)
        if not isinstance(per_block, int):
            if len(set(per_block)) != 1:
                raise ValueError(f"layers_per_block {per_block} differs between levels")
            per_block = per_block[0]
        mid = config.get("mid_block_type", "UNetMidBlock2DCrossAttn") or ""
        label = "class_embedding" if config.get("class_embed_type") else "add_embedding"
        return cls(
            layers_per_block=per_block,
            down_attention=tuple("CrossAttn" in t for t in config["down_block_types"]),
            up_attention=tuple("CrossAttn" in t for t in config["up_block_types"]),
            mid_attention="CrossAttn" in mid,
            label_embedding=label,
        )

    @property
    def num_levels(self) -> int:
        return len(self.down_attention)


def _split(path: str, head: str) -> str | None:
    """The rest of ``path`` after the prefix ``head`` ("" when equal), or None."""
    if path == head:
        return ""
    if path.startswith(head + "."):
        return path[len(head) + 1 :]
    return None


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _rename_first(rest: str, table: Mapping[str, str]) -> str:
    """Rename the leading component(s) of ``rest`` by ``table`` (longest match)."""
    for old in sorted(table, key=len, reverse=True):
        tail = _split(rest, old)
        if tail is not None:
            return _join(table[old], tail)
    return rest


def unet_path_to_original(path: str, config: Mapping | UNetLayout) -> str:
    """Diffusers UNet module path or key -> original (LDM/SGM) path, without the file prefix.

    Raises ValueError for a path with no original counterpart (e.g. a container like
    ``down_blocks.0``).
    """
    lay = UNetLayout.from_config(config)
    step = lay.layers_per_block + 1
    for old, new in _UNET_TOP.items():
        rest = _split(path, old)
        if rest is not None:
            return _join(new, rest)
    for old, new in _LABEL.items():
        rest = _split(path, f"{lay.label_embedding}.{old}")
        if rest is not None:
            return _join(new, rest)
    m = re.match(
        r"(down|up)_blocks\.(\d+)\.(resnets|attentions|downsamplers|upsamplers)\.(\d+)", path
    )
    if m:
        side, level, kind, j = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
        rest = path[m.end() + 1 :] if len(path) > m.end() else ""
        if side == "down":
            block = 1 + level * step + (lay.layers_per_block if kind == "downsamplers" else j)
            name = "input_blocks"
        else:
            block = level * step + (lay.layers_per_block if kind == "upsamplers" else j)
            name = "output_blocks"
        if kind == "resnets":
            return _join(f"{name}.{block}.0", _rename_first(rest, _RESNET))
        if kind == "attentions":
            return _join(f"{name}.{block}.1", rest)
        if kind == "downsamplers" and (tail := _split(rest, "conv")) is not None:
            return _join(f"{name}.{block}.0.op", tail)
        if kind == "upsamplers" and (tail := _split(rest, "conv")) is not None:
            index = 2 if lay.up_attention[level] else 1
            return _join(f"{name}.{block}.{index}.conv", tail)
    m = re.match(r"mid_block\.(resnets|attentions)\.(\d+)", path)
    if m:
        kind, j = m.group(1), int(m.group(2))
        rest = path[m.end() + 1 :] if len(path) > m.end() else ""
        if kind == "attentions":
            return _join("middle_block.1", rest)
        index = j * 2 if lay.mid_attention else j
        return _join(f"middle_block.{index}", _rename_first(rest, _RESNET))
    raise ValueError(f"UNet path {path!r} has no original-layout name")


def unet_path_from_original(path: str, config: Mapping | UNetLayout) -> str:
    """Original (LDM/SGM) UNet module path or key, without the file prefix -> diffusers path.

    Raises ValueError for a path that is not part of a UNet with this layout.
    """
    lay = UNetLayout.from_config(config)
    for old, new in _UNET_TOP.items():
        rest = _split(path, new)
        if rest is not None:
            return _join(old, rest)
    for old, new in _LABEL.items():
        rest = _split(path, new)
        if rest is not None:
            return _join(f"{lay.label_embedding}.{old}", rest)
    m = re.match(r"(input_blocks|output_blocks|middle_block)\.(\d+)", path)
    found = None
    if m:
        block, rest = int(m.group(2)), path[m.end() + 1 :]
        if m.group(1) == "middle_block":
            found = _from_middle(block, rest, lay)
        else:
            index, _, rest = rest.partition(".")
            side = _from_input if m.group(1) == "input_blocks" else _from_output
            found = side(block, index, rest, lay)
    if found is None:
        raise ValueError(f"original UNet path {path!r} is not part of an SD UNet with this layout")
    return found


_RESNET_BACK = {v: k for k, v in _RESNET.items()}


def _from_middle(block: int, rest: str, lay: UNetLayout) -> str | None:
    if lay.mid_attention and block == 1:
        return _join("mid_block.attentions.0", rest)
    j = block // 2 if lay.mid_attention else block
    if j <= 1:
        return _join(f"mid_block.resnets.{j}", _rename_first(rest, _RESNET_BACK))
    return None


def _from_input(block: int, index: str, rest: str, lay: UNetLayout) -> str | None:
    if block == 0:
        return None
    level, j = divmod(block - 1, lay.layers_per_block + 1)
    if level >= lay.num_levels:
        return None
    if j == lay.layers_per_block:  # the downsampler closes every level but the last
        tail = _split(rest, "op")
        if index == "0" and tail is not None and level < lay.num_levels - 1:
            return _join(f"down_blocks.{level}.downsamplers.0.conv", tail)
        return None
    if index == "0":
        return _join(f"down_blocks.{level}.resnets.{j}", _rename_first(rest, _RESNET_BACK))
    if index == "1" and lay.down_attention[level]:
        return _join(f"down_blocks.{level}.attentions.{j}", rest)
    return None


def _from_output(block: int, index: str, rest: str, lay: UNetLayout) -> str | None:
    level, j = divmod(block, lay.layers_per_block + 1)
    if level >= lay.num_levels:
        return None
    if index == "0":
        return _join(f"up_blocks.{level}.resnets.{j}", _rename_first(rest, _RESNET_BACK))
    if index == "1" and lay.up_attention[level]:
        return _join(f"up_blocks.{level}.attentions.{j}", rest)
    # The upsampler follows the last resnet (and its attention) of every level but the last.
    sampler = "2" if lay.up_attention[level] else "1"
    tail = _split(rest, "conv")
    last = j == lay.layers_per_block and level < lay.num_levels - 1
    if index == sampler and tail is not None and last:
        return _join(f"up_blocks.{level}.upsamplers.0.conv", tail)
    return None


# --- VAE --------------------------------------------------------------------------------------

_VAE_ATTN = {
    "group_norm": "norm",
    "to_q": "q",
    "to_k": "k",
    "to_v": "v",
    "to_out.0": "proj_out",
}
_VAE_RESNET = {"conv_shortcut": "nin_shortcut"}
_VAE_TOP = {"conv_norm_out": "norm_out"}


def vae_key_to_original(key: str, num_levels: int) -> str:
    """Diffusers AutoencoderKL key -> original (``first_stage_model.`` stripped) key."""
    m = re.match(r"(encoder|decoder)\.(down_blocks|up_blocks|mid_block)\.?(\d+)?\.?", key)
    if not m:
        part, _, rest = key.partition(".")
        if part in ("encoder", "decoder"):
            return _join(part, _rename_first(rest, _VAE_TOP))
        return key
    coder, kind, level = m.group(1), m.group(2), m.group(3)
    rest = key[m.end() :]
    if kind == "mid_block":
        r = re.match(r"(resnets|attentions)\.(\d+)\.?", rest)
        if r and r.group(1) == "resnets":
            tail = _rename_first(rest[r.end() :], _VAE_RESNET)
            return _join(f"{coder}.mid.block_{int(r.group(2)) + 1}", tail)
        if r:
            return _join(f"{coder}.mid.attn_1", _rename_first(rest[r.end() :], _VAE_ATTN))
    else:
        side, index = ("down", int(level)) if kind == "down_blocks" else ("up", None)
        if index is None:
            index = num_levels - 1 - int(level)  # the decoder counts its levels the other way
        r = re.match(r"(resnets\.\d+|downsamplers\.0|upsamplers\.0)\.?", rest)
        if r:
            tail = rest[r.end() :]
            if r.group(1).startswith("resnets"):
                j = r.group(1).split(".")[1]
                return _join(f"{coder}.{side}.{index}.block.{j}", _rename_first(tail, _VAE_RESNET))
            sampler = "downsample" if side == "down" else "upsample"
            return _join(f"{coder}.{side}.{index}.{sampler}", tail)
    raise ValueError(f"VAE key {key!r} has no original-layout name")


def vae_key_from_original(key: str, num_levels: int) -> str:
    """Original (``first_stage_model.`` stripped) VAE key -> diffusers AutoencoderKL key."""
    attn_back = {v: k for k, v in _VAE_ATTN.items()}
    resnet_back = {v: k for k, v in _VAE_RESNET.items()}
    m = re.match(r"(encoder|decoder)\.(down|up|mid)\.(\d+|block_\d|attn_1)\.?", key)
    if not m:
        part, _, rest = key.partition(".")
        if part in ("encoder", "decoder"):
            return _join(part, _rename_first(rest, {v: k for k, v in _VAE_TOP.items()}))
        if part in ("quant_conv", "post_quant_conv"):
            return key
        raise ValueError(f"original VAE key {key!r} is not part of an SD VAE")
    coder, side, what = m.group(1), m.group(2), m.group(3)
    rest = key[m.end() :]
    if side == "mid":
        if what == "attn_1":
            return _join(f"{coder}.mid_block.attentions.0", _rename_first(rest, attn_back))
        j = int(what.split("_")[1]) - 1
        return _join(f"{coder}.mid_block.resnets.{j}", _rename_first(rest, resnet_back))
    level = int(what) if side == "down" else num_levels - 1 - int(what)
    blocks = "down_blocks" if side == "down" else "up_blocks"
    r = re.match(r"(block\.\d+|downsample|upsample)\.?", rest)
    if r and r.group(1).startswith("block"):
        j = r.group(1).split(".")[1]
        return _join(
            f"{coder}.{blocks}.{level}.resnets.{j}", _rename_first(rest[r.end() :], resnet_back)
        )
    if r:
        return _join(f"{coder}.{blocks}.{level}.{side}samplers.0", rest[r.end() :])
    raise ValueError(f"original VAE key {key!r} is not part of an SD VAE")


def _is_vae_attention_matrix(key: str) -> bool:
    return ".mid_block.attentions." in key and key.endswith(
        ("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight")
    )


def vae_state_dict_to_original(state: Mapping[str, torch.Tensor], num_levels: int) -> dict:
    """Diffusers VAE state dict -> original keys (no prefix), attention matrices as 1x1 convs."""
    out = {}
    for key, value in state.items():
        if _is_vae_attention_matrix(key) and value.dim() == 2:
            value = value[:, :, None, None]
        out[vae_key_to_original(key, num_levels)] = value
    return out


def vae_state_dict_from_original(state: Mapping[str, torch.Tensor], num_levels: int) -> dict:
    """Original VAE keys (no prefix) -> diffusers state dict, 1x1 convs back to matrices."""
    out = {}
    for key, value in state.items():
        new = vae_key_from_original(key, num_levels)
        if _is_vae_attention_matrix(new) and value.dim() == 4:
            value = value[:, :, 0, 0]
        out[new] = value
    return out


def _vae_levels(state: Mapping[str, object], pattern: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
    if not found:
        raise ValueError("no encoder down blocks found: not an autoencoder state dict")
    return max(found) + 1


def ldm_vae_to_original(state: Mapping[str, torch.Tensor]) -> dict:
    """Diffusers AutoencoderKL state dict -> original (LDM) keys, its levels counted."""
    return vae_state_dict_to_original(state, _vae_levels(state, r"encoder\.down_blocks\.(\d+)\."))


def ldm_vae_from_original(state: Mapping[str, torch.Tensor]) -> dict:
    """Original (LDM) autoencoder keys -> diffusers AutoencoderKL state dict, levels counted."""
    return vae_state_dict_from_original(state, _vae_levels(state, r"encoder\.down\.(\d+)\."))


# --- text encoders ----------------------------------------------------------------------------

TEXT_MODEL = "text_model."
# OpenCLIP name -> transformers CLIP name (with the text_model. prefix).
_OPENCLIP_TOP = {
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
}
_OPENCLIP_BLOCK = {
    "ln_1": "layer_norm1",
    "ln_2": "layer_norm2",
    "attn.out_proj": "self_attn.out_proj",
    "mlp.c_fc": "mlp.fc1",
    "mlp.c_proj": "mlp.fc2",
}


def with_text_model_prefix(state: Mapping[str, torch.Tensor]) -> dict:
    """A transformers CLIP state dict in the ``text_model.`` layout older readers expect.

    transformers 5 flattened CLIPTextModel (``embeddings.*``, ``encoder.*``); transformers 4.x,
    A1111, ComfyUI and the original checkpoints use ``text_model.embeddings.*`` etc.
    ``text_projection.weight`` (CLIPTextModelWithProjection) stays at the top level.
    """
    out = {}
    for key, value in state.items():
        keep = key.startswith(TEXT_MODEL) or key.startswith("text_projection")
        out[key if keep else TEXT_MODEL + key] = value
    return out


def fit_text_model_prefix(state: Mapping[str, torch.Tensor], module: torch.nn.Module) -> dict:
    """Keys in the ``text_model.`` layout -> the layout ``module`` itself uses."""
    if hasattr(module, "text_model"):
        return dict(state)
    return {k.removeprefix(TEXT_MODEL): v for k, v in state.items()}


def openclip_from_hf(state: Mapping[str, torch.Tensor]) -> dict:
    """transformers CLIP state dict (either prefix layout) -> OpenCLIP keys (no file prefix).

    q/k/v projections are fused into ``attn.in_proj_weight``/``in_proj_bias`` (q, k, v order);
    ``text_projection`` is stored transposed ([width, embed] there, a Linear weight here).
    """
    state = with_text_model_prefix(state)
    top_back = {v: k for k, v in _OPENCLIP_TOP.items()}
    out: dict[str, torch.Tensor] = {}
    layers = "text_model.encoder.layers."
    for key, value in state.items():
        if key in top_back:
            out[top_back[key]] = value
        elif key == "text_projection.weight":
            out["text_projection"] = value.t().contiguous()
        elif key.startswith(layers):
            n, _, rest = key[len(layers) :].partition(".")
            block = f"transformer.resblocks.{n}."
            m = re.fullmatch(r"self_attn\.(q|k|v)_proj\.(weight|bias)", rest)
            if m:
                if m.group(1) == "q":
                    parts = [state[f"{layers}{n}.self_attn.{p}_proj.{m.group(2)}"] for p in "qkv"]
                    out[f"{block}attn.in_proj_{m.group(2)}"] = torch.cat(parts, 0)
                continue
            out[block + _rename_first(rest, {k: v for v, k in _OPENCLIP_BLOCK.items()})] = value
        elif not key.endswith("position_ids"):
            raise ValueError(f"text encoder key {key!r} has no OpenCLIP name")
    return out


def hf_from_openclip(state: Mapping[str, torch.Tensor]) -> dict:
    """OpenCLIP keys (no file prefix) -> transformers CLIP keys with the ``text_model.`` prefix.

    Raises ValueError for a key that is not part of an OpenCLIP text tower.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in _OPENCLIP_TOP:
            out[_OPENCLIP_TOP[key]] = value
        elif key == "text_projection":
            out["text_projection.weight"] = value.t().contiguous()
        elif key.startswith("transformer.resblocks."):
            n, _, rest = key[len("transformer.resblocks.") :].partition(".")
            layer = f"text_model.encoder.layers.{n}."
            m = re.fullmatch(r"attn\.in_proj_(weight|bias)", rest)
            if m:
                for name, chunk in zip("qkv", value.chunk(3, 0), strict=True):
                    out[f"{layer}self_attn.{name}_proj.{m.group(1)}"] = chunk
            else:
                out[layer + _rename_first(rest, _OPENCLIP_BLOCK)] = value
        else:
            raise ValueError(f"OpenCLIP key {key!r} is not part of a text encoder")
    return out
