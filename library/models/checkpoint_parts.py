"""Plan and build diffusers/transformers modules from an original-layout checkpoint's tensors.

For each component (UNet, VAE, text encoders) a config is chosen, first that fits every tensor:
1. the diffusers config our exporter stored in the file's metadata (exact, any size);
2. the config shipped in library/models/configs for the detected family (released models);
3. a config derived from the tensor shapes (library/models/shape_configs.py).
"Fits" is checked on the meta device from shapes alone, before any weight is read. Keys are
renamed by library/models/original_names.py. Every key under a component prefix is used, or is
known to be unused (``IGNORED_SUFFIXES``, SD 2.x's extra OpenCLIP block); any other key means the
config does not fit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from library.errors import ModelError
from library.models import original_names as names
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.checkpoint_towers import IGNORED_SUFFIXES, TextTower
from library.models.loader import reads_weights

CONFIG_METADATA = "difftune.config."  # + component name: its diffusers config as JSON
_GUESSED = {
    "unet": ("attention_head_dim", "norm_num_groups"),
    "vae": ("norm_num_groups",),
    "text": ("num_attention_heads",),
}


@dataclass
class PartPlan:
    """How to build one component: its config and the file keys it reads."""

    name: str  # unet, vae, text_encoder, text_encoder_2
    config: dict
    source: str  # "metadata", "shipped" or "derived"
    prefix: str
    keys: list[str]  # file keys (with prefix) the component reads
    convert: Callable[[dict, dict], tuple[dict, list[str]]] = field(repr=False)
    build: Callable[[dict], torch.nn.Module] = field(repr=False)


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


def empty_module(build: Callable[[dict], torch.nn.Module], config: dict) -> torch.nn.Module:
    """``build(config)`` with its weights on the meta device (shapes only, no memory)."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        return build(config)


def shapes_problem(
    expected: dict, got: dict, what: str, origins: Mapping[str, tuple[str, ...]] | None = None,
    file_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> str | None:  # fmt: skip
    """None when ``got`` (name -> shape) has exactly ``expected``'s names and shapes, else why
    not; ``what`` names the module in the message. ``origins``: the file tensors each of
    ``got``'s was converted from (and ``file_shapes`` their shapes), so that a wrong shape is
    blamed on the file's tensor (a fused qkv), not on the piece made of it (to_q)."""
    missing = sorted(set(expected) - set(got))
    if missing:
        return f"{len(missing)} weights of the {what} are not in the file (e.g. {missing[0]})"
    extra = sorted(set(got) - set(expected))
    if extra:
        return f"{len(extra)} tensors of the file do not belong to the {what} (e.g. {extra[0]})"
    for key, shape in expected.items():
        if tuple(got[key]) != tuple(shape):
            sources = (origins or {}).get(key, ())
            if not file_shapes or not sources or sources == (key,):
                return (
                    f"{key} has shape {tuple(got[key])} in the file, the {what} needs "
                    f"{tuple(shape)}"
                )
            found = ", ".join(f"{k} has shape {tuple(file_shapes[k])}" for k in sources)
            return (
                f"{found} in the file, which does not fit the {what}: its {key} would be "
                f"{tuple(got[key])} and needs {tuple(shape)}"
            )
    return None


def _fit_problem(
    file: CheckpointFile, keys: list[str], prefix: str, config: dict, convert, build
) -> str | None:
    """None when ``config`` holds exactly the file's tensors (by name and shape), else why not."""
    stripped = {k[len(prefix) :]: torch.empty(file.shape(k), device="meta") for k in keys}
    try:
        module = empty_module(build, config)
        converted, unplaced = convert(stripped, config)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return f"the config does not build ({exc})"
    if unplaced:
        return f"{len(unplaced)} tensors have no place in it (e.g. {prefix}{unplaced[0]})"
    converted = names.fit_text_model_prefix(converted, module)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    return shapes_problem(expected, {k: tuple(v.shape) for k, v in converted.items()}, "model")


def _refuse_truncated(
    file: CheckpointFile, name: str, prefix: str, keys: list[str], config: dict, convert, build
) -> None:
    """ModelError when the file lacks tensors the config in its own header promises while
    every tensor it has fits: it was cut short (shapes alone would build a smaller model)."""
    stripped = {k[len(prefix) :]: torch.empty(file.shape(k), device="meta") for k in keys}
    try:
        module = empty_module(build, config)
        converted, unplaced = convert(stripped, config)
    except (ValueError, TypeError, KeyError, IndexError):
        return
    converted = names.fit_text_model_prefix(converted, module)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    if unplaced or any(expected.get(k) != tuple(v.shape) for k, v in converted.items()):
        return
    lacking = sorted(set(expected) - set(converted))
    if lacking:
        raise ModelError(
            f"{file.path}: cannot build the {name} its header ({CONFIG_METADATA}{name}) "
            f"describes: {len(lacking)} of its tensors are not in the file (e.g. {lacking[0]}), "
            "so the file is truncated; re-download it"
        )


def plan_part(
    file: CheckpointFile,
    name: str,
    prefix: str,
    shipped: dict,
    convert,
    build,
    derive: Callable[[dict], dict],
    skip: Callable[[str], bool] = lambda key: False,
) -> PartPlan:
    """Choose the first config that fits (metadata, shipped, derived) for one component."""
    keys = [
        k
        for k in file
        if k.startswith(prefix) and not k.endswith(IGNORED_SUFFIXES) and not skip(k[len(prefix) :])
    ]
    candidates: list[tuple[str, Callable[[], dict]]] = []
    stored = file.metadata.get(CONFIG_METADATA + name)
    if stored:
        candidates.append(("metadata", lambda: json.loads(stored)))
    candidates.append(("shipped", lambda: dict(shipped)))
    candidates.append(("derived", lambda: derive({k[len(prefix) :]: file.shape(k) for k in keys})))
    problem = ""
    for source, make in candidates:
        try:
            config = make()
        except (ValueError, KeyError, IndexError, StopIteration, json.JSONDecodeError) as exc:
            problem = f"its sizes cannot be read ({type(exc).__name__}: {exc})"
            continue
        problem = _fit_problem(file, keys, prefix, config, convert, build)
        if problem is not None and source == "metadata":
            _refuse_truncated(file, name, prefix, keys, config, convert, build)
        if problem is None:
            if source == "derived":
                kind = "text" if name.startswith("text") else name
                shape_configs.note_guesses(f"{file.path.name} {name}", config, _GUESSED[kind])
            return PartPlan(name, config, source, prefix, keys, convert, build)
    raise ModelError(f"{file.path}: cannot build the {name} from {prefix}*: {problem}")


def load_part(file: CheckpointFile, plan: PartPlan, dtype: torch.dtype) -> torch.nn.Module:
    """Build the module of ``plan`` and fill it with the file's tensors in ``dtype`` (inside
    loader.shapes_only(): only build it, on the meta device)."""
    if not reads_weights():
        return empty_module(plan.build, plan.config).to(dtype).requires_grad_(False).eval()
    state = {k[len(plan.prefix) :]: file.tensor(k).to(dtype) for k in plan.keys}
    converted, _ = plan.convert(state, plan.config)
    del state
    module = empty_module(plan.build, plan.config)
    converted = names.fit_text_model_prefix(converted, module)
    module.load_state_dict(converted, strict=True, assign=True)
    floats = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
    if any(t.device.type == "meta" for t in floats):
        raise ModelError(f"{file.path}: some {plan.name} weights were not loaded")
    if any(t.dtype != dtype for t in floats):
        module.to(dtype)
    module.requires_grad_(False)
    module.eval()
    return module


def read_config(folder: Path, name: str) -> dict:
    return json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))


def plan_components(
    file: CheckpointFile, towers: Sequence[TextTower], config_dir: Path
) -> list[PartPlan]:
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


def _plan_tower(file: CheckpointFile, tower: TextTower, base: dict) -> PartPlan:
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
