"""Qwen-Image's VAE in the Wan 2.1 layout, the names of ComfyUI's qwen_image_vae.safetensors.

Qwen-Image's autoencoder is Wan 2.1's video VAE fine-tuned, and ComfyUI reads it with its Wan
VAE, so Comfy-Org distributes it in the names of Wan's original code. Those differ from
diffusers' AutoencoderKLQwenImage in how blocks are grouped, not in what they hold:

- a residual block is a sequence (``residual.0`` RMS norm gamma, ``residual.2`` conv,
  ``residual.3`` gamma, ``residual.6`` conv) with a ``shortcut`` conv; diffusers names them
  norm1, conv1, norm2, conv2 and conv_shortcut;
- the encoder's ``downsamples`` are one flat list (residual blocks, then a resample, per level),
  which diffusers keeps as ``down_blocks`` with the same numbering;
- the decoder's ``upsamples`` are one flat list too: per level ``num_res_blocks + 1`` residual
  blocks and (but for the last level) one resample; diffusers groups them as
  ``up_blocks.<level>.resnets.<j>`` and ``up_blocks.<level>.upsamplers.0``;
- ``middle.0`` / ``middle.2`` are the middle residual blocks and ``middle.1`` its attention;
  ``head.0`` / ``head.2`` the output norm and conv; ``conv1`` / ``conv2`` (top level) the quant
  and post-quant convs, ``encoder.conv1`` / ``decoder.conv1`` the input convs.

Wan 2.2's VAE (TI2V-5B's, Wan-AI's Wan2.2_VAE.pth and Comfy-Org's wan2.2_vae.safetensors;
diffusers' AutoencoderKLWan with ``is_residual``) nests one level deeper: each encoder level is
``downsamples.<level>`` holding its residual blocks and resample as ``downsamples.<j>``
(diffusers: ``down_blocks.<level>.resnets.<j>`` and ``.downsampler``), each decoder level
``upsamples.<level>.upsamples.<j>`` (``up_blocks.<level>.resnets.<j>`` and ``.upsampler``, a
level having ``num_res_blocks + 1`` residual blocks); the rest is named as in Wan 2.1.

Renaming only: tensors keep their shapes and dtypes.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

import torch

from library.models.checkpoint_parts import empty_module

# diffusers' residual-block part -> Wan's
_RESIDUAL = (
    ("norm1.", "residual.0."),
    ("conv1.", "residual.2."),
    ("norm2.", "residual.3."),
    ("conv2.", "residual.6."),
    ("conv_shortcut.", "shortcut."),
)
_FIXED = {
    "encoder.conv_in.": "encoder.conv1.",
    "decoder.conv_in.": "decoder.conv1.",
    "encoder.norm_out.": "encoder.head.0.",
    "encoder.conv_out.": "encoder.head.2.",
    "decoder.norm_out.": "decoder.head.0.",
    "decoder.conv_out.": "decoder.head.2.",
    "quant_conv.": "conv1.",
    "post_quant_conv.": "conv2.",
}
_MID = {"resnets.0.": "middle.0.", "attentions.0.": "middle.1.", "resnets.1.": "middle.2."}
# A key that only the Wan layout has, and one only diffusers' has.
ORIGINAL_MARK = "encoder.conv1.weight"
DIFFUSERS_MARK = "encoder.conv_in.weight"
# Wan 2.2's VAE (the nested, residual levels) in the Wan layout and in diffusers'
RESIDUAL_MARKS = ("encoder.downsamples.0.downsamples.0.", "encoder.down_blocks.0.resnets.0.")


def _residual(rest: str) -> str:
    for ours, theirs in _RESIDUAL:
        if rest.startswith(ours):
            return theirs + rest[len(ours) :]
    return rest  # a resample's resample.1 / time_conv keep their names


_LEVEL_RESNET = re.compile(r"(encoder|decoder)\.(down|up)_blocks\.(\d+)\.resnets\.(\d+)\.(.+)")
_LEVEL_RESAMPLE = re.compile(r"(encoder|decoder)\.(down|up)_blocks\.(\d+)\.(down|up)sampler\.(.+)")


def is_residual(keys) -> bool:
    """The keys are Wan 2.2's VAE's (in either layout)."""
    return any(k.startswith(RESIDUAL_MARKS) for k in keys)


def _residual_level(key: str, num_res_blocks: int) -> str | None:
    """The Wan-layout name of a Wan 2.2 VAE level's tensor (None: not one)."""
    if found := _LEVEL_RESNET.fullmatch(key):
        side, way, level, index, rest = found.groups()
        return f"{side}.{way}samples.{level}.{way}samples.{index}.{_residual(rest)}"
    if found := _LEVEL_RESAMPLE.fullmatch(key):
        side, way, level, _, rest = found.groups()
        index = num_res_blocks + (way == "up")  # after the level's residual blocks
        return f"{side}.{way}samples.{level}.{way}samples.{index}.{rest}"
    return None


def original_name(key: str, num_res_blocks: int, residual: bool = False) -> str:
    """The Wan-layout name of diffusers' AutoencoderKLQwenImage tensor ``key`` (a VAE whose
    levels have ``num_res_blocks`` residual blocks; ``residual``: Wan 2.2's AutoencoderKLWan);
    ValueError for a name it does not have."""
    for ours, theirs in _FIXED.items():
        if key.startswith(ours):
            return theirs + key[len(ours) :]
    if residual and (name := _residual_level(key, num_res_blocks)) is not None:
        return name
    if found := re.match(r"encoder\.down_blocks\.(\d+)\.(.+)", key):
        return f"encoder.downsamples.{found[1]}.{_residual(found[2])}"
    if found := re.match(r"(encoder|decoder)\.mid_block\.((?:resnets|attentions)\.\d+\.)(.+)", key):
        side, block, rest = found.groups()
        if block not in _MID:
            raise ValueError(f"{key}: the original layout has one attention in the middle block")
        return f"{side}.{_MID[block]}{_residual(rest) if block.startswith('resnets') else rest}"
    per_level = num_res_blocks + 2  # its residual blocks, then its resample
    if found := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", key):
        index = int(found[1]) * per_level + int(found[2])
        return f"decoder.upsamples.{index}.{_residual(found[3])}"
    if found := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)", key):
        index = int(found[1]) * per_level + num_res_blocks + 1
        return f"decoder.upsamples.{index}.{found[2]}"
    raise ValueError(f"{key}: not a tensor of this VAE (AutoencoderKLQwenImage)")


def vae_to_original(state: Mapping[str, torch.Tensor], config: Mapping) -> dict[str, torch.Tensor]:
    """``state`` (diffusers' names) in the Wan layout, for a VAE of ``config``."""
    blocks, residual = int(config["num_res_blocks"]), bool(config.get("is_residual"))
    return {original_name(k, blocks, residual): v for k, v in state.items()}


def vae_from_original(
    original: Mapping[str, torch.Tensor], config: Mapping
) -> dict[str, torch.Tensor]:
    """The Wan-layout ``original`` in diffusers' names, for a VAE of ``config``; KeyError
    naming a tensor no VAE of that config has."""
    names = diffusers_names(config, original)
    return {names[k]: v for k, v in original.items()}


def diffusers_names(config: Mapping, original: Mapping) -> dict[str, str]:
    """Wan-layout name -> diffusers' name for the keys of ``original`` (KeyError naming one
    that a VAE of ``config`` does not have)."""
    from diffusers import AutoencoderKLQwenImage, AutoencoderKLWan

    residual = bool(config.get("is_residual"))
    # AutoencoderKLWan's config of the Wan 2.1 VAE has further keys at values that add no
    # tensor (decoder_base_dim, is_residual, patch_size unset): the same keys by the same names
    cls = AutoencoderKLWan if residual else AutoencoderKLQwenImage
    accepted = inspect.signature(cls.__init__).parameters
    config = {k: v for k, v in config.items() if k in accepted}
    module = empty_module(lambda c: cls(**c), config)
    blocks = int(config["num_res_blocks"])
    table = {original_name(k, blocks, residual): k for k in module.state_dict()}
    missing = [k for k in original if k not in table]
    if missing:
        raise KeyError(missing[0])
    return table
