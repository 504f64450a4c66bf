"""Plan and build diffusers/transformers modules from an original-layout checkpoint's tensors.

For each component (UNet, VAE, text encoders) a config is chosen, first that fits every tensor:
1. the diffusers config our exporter stored in the file's metadata (exact, any size);
2. the config shipped in library/models/configs for the detected family (released models);
3. a config derived from the tensor shapes (library/models/shape_configs.py).
"Fits" is checked on the meta device from shapes alone, before any weight is read, by the one
plan system (library/models/plans.py); loading is its ``load_plan``. Keys are renamed by
library/models/original_names.py. Every key under a component prefix is used, or is
known to be unused (``IGNORED_SUFFIXES``, SD 2.x's extra OpenCLIP block); any other key means the
config does not fit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from library.models import original_names as names
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.checkpoint_towers import IGNORED_SUFFIXES, TextTower
from library.models.plans import CONFIG_METADATA as CONFIG_METADATA  # the exporters' import
from library.models.plans import Convert, Plan, choose_plan
from library.models.plans import empty_module as empty_module  # the tiny-file writers' import

_GUESSED = {
    "unet": ("attention_head_dim", "norm_num_groups"),
    "vae": ("norm_num_groups",),
    "text": ("num_attention_heads",),
}


# --- converters: original keys (prefix stripped) -> diffusers keys; unplaced keys listed ----


def convert_unet(state: dict, config: dict) -> tuple[dict, list[str]]:
    layout = names.UNetLayout.from_config(config)
    out, unplaced = {}, []
    for key, value in state.items():
        try:
            out[names.unet_path_from_original(key, layout)] = value
        except ValueError:
            unplaced.append(key)
    return out, unplaced


def convert_vae(state: dict, config: dict) -> tuple[dict, list[str]]:
    levels = len(config["block_out_channels"])
    placed, unplaced = {}, []
    for key, value in state.items():
        try:
            names.vae_key_from_original(key, levels)
            placed[key] = value
        except ValueError:
            unplaced.append(key)
    return names.vae_state_dict_from_original(placed, levels), unplaced


def text_converter(tower: TextTower) -> Callable[[dict, dict], tuple[dict, list[str]]]:
    def convert(state: dict, config: dict) -> tuple[dict, list[str]]:
        if tower.kind == "clip":
            return names.with_text_model_prefix(state), []
        try:
            return names.hf_from_openclip(state), []
        except ValueError:
            known = [k for k in state if _is_openclip_key(k)]
            unplaced = [k for k in state if k not in known]
            return names.hf_from_openclip({k: state[k] for k in known}), unplaced

    return convert


def _is_openclip_key(key: str) -> bool:
    try:
        names.hf_from_openclip({key: torch.empty(3, 3, device="meta")})
    except ValueError:
        return False
    return True


# --- builders (called under accelerate's init_empty_weights) -------------------------------


def build_unet(config: dict) -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel.from_config(config)


def build_vae(config: dict) -> torch.nn.Module:
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_config(config)


def text_builder(tower: TextTower) -> Callable[[dict], torch.nn.Module]:
    def build(config: dict) -> torch.nn.Module:
        from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

        cls = CLIPTextModelWithProjection if tower.with_projection else CLIPTextModel
        return cls(CLIPTextConfig(**config))

    return build


# --- planning ------------------------------------------------------------------------------


def _strict(convert, config: dict, prefix: str) -> Convert:
    """``convert`` (original keys without ``prefix`` -> diffusers keys, and the keys it has no
    place for) as a plan's converter of file keys, which refuses a key without a place."""

    def run(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out, unplaced = convert({k[len(prefix) :]: v for k, v in state.items()}, config)
        if unplaced:
            raise ValueError(
                f"{len(unplaced)} tensors have no place in it (e.g. {prefix}{unplaced[0]})"
            )
        return out

    return run


def plan_part(
    file: CheckpointFile,
    name: str,
    prefix: str,
    shipped: dict,
    convert,
    build,
    derive: Callable[[dict], dict],
    skip: Callable[[str], bool] = lambda key: False,
) -> Plan:
    """The plan of one component under ``prefix`` with the first config that fits: the file's
    stored one, the ``shipped`` one, or ``derive`` of the original-named shapes."""
    keys = [
        k
        for k in file
        if k.startswith(prefix) and not k.endswith(IGNORED_SUFFIXES) and not skip(k[len(prefix) :])
    ]

    def plan_of(config: dict) -> Plan:
        return Plan(name, "", file, keys, config, _strict(convert, config, prefix), build)

    plan = choose_plan(
        name, plan_of, file,
        (
            ("shipped", lambda: dict(shipped)),
            ("derived", lambda: derive({k[len(prefix) :]: file.shape(k) for k in keys})),
        ),
    )  # fmt: skip
    if plan.source == "derived":
        kind = "text" if name.startswith("text") else name
        shape_configs.note_guesses(f"{file.path.name} {name}", plan.config, _GUESSED[kind])
    return plan


def read_config(folder: Path, name: str) -> dict:
    return json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))


def plan_components(
    file: CheckpointFile, towers: Sequence[TextTower], config_dir: Path
) -> list[Plan]:
    """Plans for the UNet, the VAE and each text encoder of ``towers`` (the file layout's), in
    that order."""
    pooled = None
    if towers[-1].with_projection and towers[-1].prefix + "text_projection" in file:
        pooled = file.shape(towers[-1].prefix + "text_projection")[1]
    unet_base, vae_base = read_config(config_dir, "unet"), read_config(config_dir, "vae")
    plans = [
        plan_part(
            file, "unet", names.UNET_PREFIX, unet_base, convert_unet, build_unet,
            lambda s: shape_configs.unet_config_from_shapes(s, unet_base, pooled),
        ),
        plan_part(
            file, "vae", names.VAE_PREFIX, vae_base, convert_vae, build_vae,
            lambda s: shape_configs.vae_config_from_shapes(s, vae_base),
        ),
    ]  # fmt: skip
    for tower in towers:
        plans.append(_plan_tower(file, tower, read_config(config_dir, tower.subfolder)))
    return plans


def _plan_tower(file: CheckpointFile, tower: TextTower, base: dict) -> Plan:
    skip = _tower_skip(file, tower)
    convert = text_converter(tower)

    def derive(shapes: dict) -> dict:
        meta = {k: torch.empty(v, device="meta") for k, v in shapes.items()}
        hf, _ = convert(meta, base)
        return shape_configs.text_config_from_shapes(
            {k: tuple(v.shape) for k, v in hf.items()}, base
        )

    return plan_part(
        file, tower.subfolder, tower.prefix, base, convert, text_builder(tower), derive, skip
    )


def _tower_skip(file: CheckpointFile, tower: TextTower) -> Callable[[str], bool]:
    """Keys of a tower that exist in original files but not in the diffusers encoder."""
    if not tower.extra_last_block:
        return lambda key: False
    blocks = {
        int(k[len(tower.prefix) :].split(".")[2])
        for k in file
        if k.startswith(tower.prefix + "transformer.resblocks.")
    }
    last = f"transformer.resblocks.{max(blocks)}." if blocks else None
    # SD 2.x has no pooled embedding; OpenCLIP's projection is part of the file but unused.
    return lambda key: key == "text_projection" or (last is not None and key.startswith(last))
