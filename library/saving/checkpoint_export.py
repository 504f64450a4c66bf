"""Write models in the layouts other tools load: one original-layout checkpoint file (A1111,
ComfyUI, diffusers ``from_single_file``), and text-encoder folders in the ``text_model.`` layout.

Original layout (docs/formats.md, single-file checkpoints): ``model.diffusion_model.*`` (UNet,
LDM/SGM names), ``first_stage_model.*`` (VAE, attention as 1x1 convs) and the text encoders: SD 1.x
``cond_stage_model.transformer.text_model.*``; SD 2.x OpenCLIP ``cond_stage_model.model.*`` with
fused q/k/v and one block more than the diffusers encoder (a copy of its last, never used: SD 2.x
conditions on the penultimate block, and loaders built for OpenCLIP ViT-H expect 24 blocks); SDXL
``conditioner.embedders.0.transformer.text_model.*`` and ``conditioner.embedders.1.model.*``.
Each component's diffusers config is stored in the metadata (``difftune.config.<name>``), so
difftune rebuilds even non-standard sizes exactly; other tools ignore those keys.

Why the ``text_model.`` layout: transformers 5 saves CLIPTextModel without that prefix, and
transformers 4.x loads such a file without error but with every weight freshly initialised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from library.models import original_names as names
from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.checkpoint_towers import TextTower
from library.saving.atomic import atomic_write_dir
from library.saving.streamed import save_streamed


def _cast(state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}


def unet_tensors(unet: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The UNet's weights under their original (LDM/SGM) names, with the file prefix."""
    layout = names.UNetLayout.from_config(unet.config)
    return {
        names.UNET_PREFIX + names.unet_path_to_original(k, layout): v
        for k, v in unet.state_dict().items()
    }


def vae_tensors(vae: torch.nn.Module) -> dict[str, torch.Tensor]:
    levels = len(vae.config.block_out_channels)
    state = names.vae_state_dict_to_original(vae.state_dict(), levels)
    return {names.VAE_PREFIX + k: v for k, v in state.items()}


def text_tensors(encoder: torch.nn.Module, tower: TextTower) -> dict[str, torch.Tensor]:
    """One text encoder under its original names, with the tower's file prefix."""
    state = names.with_text_model_prefix(encoder.state_dict())
    if tower.kind == "clip":
        state.pop("text_projection.weight", None)  # OpenAI CLIP towers are stored without it
        return {tower.prefix + k: v for k, v in state.items()}
    out = names.openclip_from_hf(state)
    if tower.extra_last_block:
        last = encoder.config.num_hidden_layers - 1
        head = f"transformer.resblocks.{last}."
        for key in [k for k in out if k.startswith(head)]:
            out[f"transformer.resblocks.{last + 1}." + key[len(head) :]] = out[key].clone()
    return {tower.prefix + k: v for k, v in out.items()}


def _config_json(module: torch.nn.Module) -> str:
    config = module.config
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return json.dumps(data, default=list, sort_keys=True)


def single_file_parts(
    unet: torch.nn.Module,
    vae: torch.nn.Module,
    text_encoders: Sequence[torch.nn.Module],
    family,
) -> tuple[list[dict[str, torch.Tensor]], dict[str, str]]:
    """The tensors of an original-layout checkpoint, one group per component, as the modules
    hold them (not yet cast), and the config metadata that goes with them."""
    layout = family.checkpoint_layout()
    if len(text_encoders) != len(layout.towers):
        raise ValueError(
            f"a {layout.name} checkpoint has {len(layout.towers)} text encoders, got "
            f"{len(text_encoders)}"
        )
    groups = [unet_tensors(unet), vae_tensors(vae)]
    configs = {"unet": _config_json(unet), "vae": _config_json(vae)}
    for encoder, tower in zip(text_encoders, layout.towers, strict=True):
        groups.append(text_tensors(encoder, tower))
        configs[tower.subfolder] = _config_json(encoder)
    metadata = {CONFIG_METADATA + name: text for name, text in configs.items()}
    metadata["modelspec.prediction_type"] = family.modelspec_prediction_type
    return groups, metadata


def write_single_file(
    path: str | Path,
    unet: torch.nn.Module,
    vae: torch.nn.Module,
    text_encoders: Sequence[torch.nn.Module],
    family,
    dtype: torch.dtype,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write UNet, VAE and text encoders (diffusers/transformers modules) as one original-layout
    ``.safetensors`` file, atomically, one tensor at a time (library.saving.streamed: no second
    copy of the model in memory). ``metadata`` (all strings) is added to the header; a
    ``modelspec.prediction_type`` in it wins over the family's."""
    groups, own = single_file_parts(unet, vae, text_encoders, family)
    header = {**own, **dict(metadata or {})}
    return save_streamed(path, groups, header, dtype)


def export_full_unet_checkpoint(
    path: str | Path,
    trained_unet: torch.nn.Module,
    base,
    family,
    dtype: torch.dtype,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """A full fine-tune as one checkpoint: the trained UNet plus the base model's VAE and text
    encoders as loaded (``base`` is the run's Components, so a ``vae`` override is included)."""
    return write_single_file(
        path, trained_unet, base.vae, base.text_encoders, family, dtype, metadata
    )


def write_text_encoder_folder(
    module: torch.nn.Module, folder: str | Path, dtype: torch.dtype | None = None
) -> Path:
    """A transformers text-encoder folder (config.json + model.safetensors, atomically) whose
    weights use the ``text_model.`` names transformers 4.x, diffusers and other readers expect."""
    state = names.with_text_model_prefix(module.state_dict())
    tensors = _cast(state, dtype or next(module.parameters()).dtype)

    def write(tmp: Path) -> None:
        module.config.to_json_file(str(tmp / "config.json"))
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})

    return atomic_write_dir(Path(folder), write)


def is_clip_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a transformers CLIP text encoder (its config.json says so)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and str(config.get("model_type", "")).startswith("clip")


def ensure_text_model_layout(folder: str | Path) -> list[Path]:
    """Rewrite, in place, the safetensors weights of a transformers CLIP text-encoder folder
    (any other folder, such as T5's, is left alone)
    (e.g. one copied from a base model saved by transformers 5) so every key uses the
    ``text_model.`` layout; tensors and header metadata are kept as they are. Returns the files
    rewritten (none when the folder already has that layout)."""
    folder = Path(folder)
    if not is_clip_folder(folder):  # T5 (FLUX.1, SD3) has no text_model. layout to restore
        return []
    rewritten = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            keys, metadata = list(handle.keys()), handle.metadata()
        if names.with_text_model_prefix(dict.fromkeys(keys)).keys() == set(keys):
            continue
        save_file(names.with_text_model_prefix(load_file(file)), file, metadata=metadata)
        rewritten.append(file)
    index = folder / "model.safetensors.index.json"
    if rewritten and index.is_file():
        data = json.loads(index.read_text(encoding="utf-8"))
        data["weight_map"] = names.with_text_model_prefix(data.get("weight_map", {}))
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return rewritten
