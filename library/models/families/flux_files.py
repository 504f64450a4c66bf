"""FLUX.1 from the single files users have: the transformer file (pretrained_model_name_or_path)
and the [flow] clip_l, t5xxl and ae files.

The transformer is read as Black Forest Labs and ComfyUI ship it (``double_blocks.*``, optionally
under ``model.diffusion_model.``) or in diffusers' names; clip_l in transformers' CLIPTextModel
names (with or without ``text_model.``), t5xxl in T5EncoderModel names, ae in BFL's
ae.safetensors names or diffusers' AutoencoderKL names. Each file's config is the one in its
metadata (``difftune.config.<part>``, written by difftune) when it fits, else the full-size FLUX.1
config with the sizes the tensors show (layer counts, widths), so pruned and tiny models load
too. Every file's header and shapes are checked, and the tokenizers found, before any weight is
read; weights stored in fp8, fp16 or bf16 are cast to the weight dtype on load.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models import original_names as names
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.checkpoint_parts import CONFIG_METADATA, empty_module, shapes_problem
from library.models.families.flux_load import FluxParts, freeze, refuse_channels
from library.models.families.flux_tokenizers import (
    check_vocab,
    find_t5_tokenizer_folder,
    load_t5_tokenizer,
    missing_t5_tokenizer,
    t5_tokenizer_files,
)
from library.models.flux import shapes as flux_shapes
from library.models.flux.original_keys import (
    FluxKeys,
    ae_from_original,
    convert_shapes,
    detect_flux,
    transformer_from_original,
)
from library.models.loader import offline, one_line

_FLOW_FILES = {
    "clip_l": "the CLIP-L text encoder (clip_l.safetensors)",
    "t5xxl": "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)",
    "ae": "the autoencoder (ae.safetensors)",
}


@dataclass
class _Plan:
    """How to build one module from one file: the keys it reads, its config, the renaming."""

    part: str  # transformer, text_encoder, text_encoder_2, vae (diffusers' subfolder names)
    what: str  # how errors name the file: "clip_l = /x.safetensors"
    file: CheckpointFile
    keys: list[str]
    config: dict
    convert: Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]] = field(repr=False)
    build: Callable[[dict], torch.nn.Module] = field(repr=False)
    # Convert the keys in groups (by the group name this gives each key), so that only one
    # group's tensors are held twice, and copy the pieces of split tensors; None: all at once.
    group: Callable[[str], str] | None = field(default=None, repr=False)


def load_flux_files(
    path: Path,
    model: ModelSection,
    flow: FlowSection,
    weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> FluxParts:
    from library.models.tokenizers import load_tokenizer_for

    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    transformer_file = _open(path, "pretrained_model_name_or_path")
    found = detect_flux(transformer_file.keys())
    if found is None:
        raise ModelError(
            f"{path} holds no FLUX.1 transformer ({_sample(transformer_file.keys())}); point "
            "pretrained_model_name_or_path at flux1-dev/schnell.safetensors or a diffusers folder"
        )
    files = {key: _flow_file(flow, key) for key in _FLOW_FILES}
    plans = [
        plan_transformer(transformer_file, found),
        plan_clip(files["clip_l"]),
        plan_t5(files["t5xxl"]),
        plan_ae(files["ae"]),
    ]
    refuse_channels(path, plans[0].config["in_channels"])
    t5_folder = find_t5_tokenizer_folder(flow.t5_tokenizer_path, model.tokenizer_cache_dir)
    if t5_folder is None:
        raise ModelError(missing_t5_tokenizer(flow.t5_tokenizer_path, path))
    t5_folder = t5_tokenizer_files(
        t5_folder, "set t5_tokenizer_path in [flow] to a folder with it"
    )
    clip_config, t5_config = plans[1].config, plans[2].config
    with offline():
        clip_tokenizer = load_tokenizer_for(
            "clip",
            0,
            path,
            model.tokenizer_path,
            model.tokenizer_cache_dir,
            clip_config["max_position_embeddings"],
        )
        where = clip_tokenizer.name_or_path or "the CLIP tokenizer folder"
        check_vocab(where, clip_tokenizer, clip_config["vocab_size"], "CLIP-L")
        t5_tokenizer = load_t5_tokenizer(t5_folder, t5_config["vocab_size"])
        transformer, clip_l, t5 = (_load_plan(p, weight_dtype) for p in plans[:3])
        vae = _load_plan(plans[3], vae_dtype)
    return FluxParts(
        transformer, vae, clip_l, t5, clip_tokenizer, t5_tokenizer, found.variant, path
    )


def _open(path: Path, what: str) -> CheckpointFile:
    if path.suffix.lower() != ".safetensors":
        raise ModelError(
            f"{what} = {path}: FLUX.1 component files are read as .safetensors only; convert "
            "the file with a tool you trust"
        )
    try:
        return CheckpointFile(path)
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from None


def _flow_file(flow: FlowSection, key: str) -> CheckpointFile:
    """The [flow] file ``key``, its header read; ModelError naming the key when unusable."""
    value = getattr(flow, key)
    if not value:
        raise ModelError(
            f"Flux.1 as a single transformer file needs {_FLOW_FILES[key]}: set {key} = "
            f'"<path to {key}.safetensors>" in [flow] (or use a diffusers folder)'
        )
    path = Path(value).expanduser().absolute()
    if not path.is_file():
        raise ModelError(
            f"{key} = {path} does not exist; set {key} in [flow] to {_FLOW_FILES[key]}"
        )
    return _open(path, key)


def _sample(keys: Iterable[str]) -> str:
    first = sorted(keys)[:2]
    return f"keys like {', '.join(first)}" if first else "no tensors"


def _looks_like(keys: list[str]) -> str:
    """What a file holds, by its key names, for errors about a file given in the wrong place."""
    if detect_flux(keys) is not None:
        return "a FLUX.1 transformer"
    if any(".SelfAttention." in k for k in keys):
        return "a T5 encoder"
    if any(k.endswith("embeddings.token_embedding.weight") for k in keys):
        return "a CLIP text encoder"
    if any(re.match(r"(first_stage_model\.|vae\.)?encoder\.down(_blocks)?\.0\.", k) for k in keys):
        return "an autoencoder"
    if any(k.startswith("model.diffusion_model.input_blocks.") for k in keys):
        return "an SD UNet checkpoint"
    return _sample(keys)


def _refuse_scaled_fp8(file: CheckpointFile, what: str) -> None:
    keys = file.keys()
    if "scaled_fp8" in keys or any(k.endswith(".scale_weight") for k in keys):
        raise ModelError(
            f"{what} = {file.path} is in ComfyUI's scaled fp8 format (scale_weight tensors), "
            "which difftune does not read; use the bf16, fp16 or plain fp8 (e4m3fn) file"
        )


def _wrong_file(what: str, file: CheckpointFile, expected: str, problem: str) -> ModelError:
    return ModelError(
        f"{what} = {file.path} is not {expected}: {problem} (the file looks like "
        f"{_looks_like(file.keys())}); set {what} in [flow] to {expected}'s file"
    )


def _config_for(
    part: str, plan_of: Callable[[dict], _Plan], file: CheckpointFile, derive: Callable[[], dict]
) -> _Plan:
    """The plan with the file's stored config if it fits, else with ``derive()``'s.

    ModelError (from ``derive`` or the fit check) when the derived config does not fit either.
    """
    stored = file.metadata.get(CONFIG_METADATA + part)
    if stored:
        try:
            plan = plan_of(json.loads(stored))
            if _fit_problem(plan) is None:
                return plan
        except (ValueError, TypeError, KeyError):
            pass  # a stale or foreign config: the shapes decide
    plan = plan_of(derive())
    problem = _fit_problem(plan)
    if problem:
        raise ModelError(f"{plan.what} = {file.path}: {problem}; re-download or re-convert it")
    return plan


def _fit_problem(plan: _Plan) -> str | None:
    """None when the plan's module holds exactly the file's tensors (names and shapes)."""
    try:
        module = empty_module(plan.build, plan.config)
        got = convert_shapes(plan.convert, {k: plan.file.shape(k) for k in plan.keys})
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return f"cannot build the {plan.part} from it ({one_line(exc)})"
    got = names.fit_text_model_prefix(got, module) if plan.part == "text_encoder" else got
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    return shapes_problem(expected, got, f"FLUX.1 {plan.part}")


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of the tensors that share storage (pieces of one split fused projection), so
    that every parameter owns its memory: replacing one (a cast, a move to the GPU) then frees
    it, where a view would keep the whole fused tensor alive."""
    seen: dict[int, int] = {}
    for value in state.values():
        ptr = value.untyped_storage().data_ptr()
        seen[ptr] = seen.get(ptr, 0) + 1
    return {
        k: v.clone() if seen[v.untyped_storage().data_ptr()] > 1 else v for k, v in state.items()
    }


def _load_plan(plan: _Plan, dtype: torch.dtype) -> torch.nn.Module:
    """Read, cast, rename and load the plan's tensors; the module frozen, in ``dtype``."""
    groups: dict[str, list[str]] = {}
    for key in plan.keys:
        groups.setdefault(plan.group(key) if plan.group else "", []).append(key)
    state: dict[str, torch.Tensor] = {}
    for keys in groups.values():
        converted = plan.convert({k: plan.file.tensor(k).to(dtype) for k in keys})
        state.update(_unshared(converted) if plan.group else converted)
    module = empty_module(plan.build, plan.config)
    if plan.part == "text_encoder":
        state = names.fit_text_model_prefix(state, module)
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # the shapes were checked; a changed file shows up here
        raise ModelError(f"{plan.what} = {plan.file.path}: {one_line(exc)}") from None
    if plan.part == "text_encoder_2":
        module.tie_weights()  # shared.weight and encoder.embed_tokens.weight: one tensor
    floats = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
    if any(t.device.type == "meta" for t in floats):
        raise ModelError(f"{plan.what} = {plan.file.path}: some weights were not loaded")
    if any(t.dtype != dtype for t in floats):
        module.to(dtype)
    freeze(module)
    return module


# --- transformer --------------------------------------------------------------------------------


def plan_transformer(file: CheckpointFile, found: FluxKeys) -> _Plan:
    what = "pretrained_model_name_or_path"
    _refuse_scaled_fp8(file, what)
    # A ComfyUI-style checkpoint may hold other parts beside model.diffusion_model.*.
    keys = [k for k in file if k.startswith(found.prefix)]
    original = found.layout == "original"
    block_head = re.compile(re.escape(found.prefix) + r"(double_blocks|single_blocks)\.\d+\.")

    def block(key: str) -> str:
        # Each block's fused tensors with its own keys: linear1's split needs its weight's width.
        found_block = block_head.match(key)
        return found_block.group(0) if found_block else ""

    def convert(state):
        return transformer_from_original(state) if original else dict(state)

    def plan_of(config: dict) -> _Plan:
        return _Plan(
            "transformer", what, file, keys, config, convert, _build_transformer, group=block
        )

    def derive() -> dict:
        try:
            shapes = convert_shapes(convert, {k: file.shape(k) for k in keys})
        except ValueError as exc:
            raise ModelError(
                f"{file.path}: {one_line(exc)}; it is not a FLUX.1 transformer"
            ) from None
        return transformer_config_from_shapes(shapes, found)

    return _config_for("transformer", plan_of, file, derive)


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel.from_config(config)


def transformer_config_from_shapes(shapes: Mapping[str, tuple[int, ...]], found: FluxKeys) -> dict:
    """FluxTransformer2DModel kwargs for diffusers-named shapes: the full-size config of the
    variant with the widths and block counts the tensors show.

    The rotary axes do not show in any shape: FLUX.1's (16, 56, 56) when they fit the head
    width, else a guess in the same proportions (with a warning).
    """
    base = flux_shapes.transformer_config(found.variant)
    width, in_channels = shapes["x_embedder.weight"]
    out_channels = shapes["proj_out.weight"][0]
    norm = next(v for k, v in shapes.items() if k.endswith(".attn.norm_q.weight"))
    head_dim = norm[0]
    config = {
        **base,
        "in_channels": in_channels,
        "out_channels": None if out_channels == in_channels else out_channels,
        "num_layers": found.double_blocks,
        "num_single_layers": found.single_blocks,
        "attention_head_dim": head_dim,
        "num_attention_heads": width // head_dim,
        "joint_attention_dim": shapes["context_embedder.weight"][1],
        "pooled_projection_dim": shapes["time_text_embed.text_embedder.linear_1.weight"][1],
    }
    if sum(base["axes_dims_rope"]) != head_dim:
        # FLUX.1 gives 7/16 of each head to rows and to columns, the rest to the image index.
        side = 2 * (head_dim * 7 // 32)
        config["axes_dims_rope"] = (head_dim - 2 * side, side, side)
        shape_configs.note_guesses("transformer", config, ("axes_dims_rope",))
    return config


def _note_derived(what: str, file: CheckpointFile, config: dict, base: dict, guessed: str) -> None:
    """Warn that a file's sizes differ from FLUX.1's and which field had to be guessed."""
    if any(config.get(k) != v for k, v in base.items() if k != guessed):
        shape_configs.note_guesses(f"{what} {file.path.name}", config, (guessed,))


# --- CLIP-L -------------------------------------------------------------------------------------

# Tensors of published clip_l files that CLIPTextModel does not have: transformers 4.x's
# position_ids buffer, the projection (FLUX.1 takes the pooled output without it), CLIP's logit
# scale.
_CLIP_UNUSED = ("position_ids", "text_projection.weight", "logit_scale")


def plan_clip(file: CheckpointFile) -> _Plan:
    what, expected = "clip_l", "the CLIP-L text encoder"
    _refuse_scaled_fp8(file, what)
    keys = [k for k in file if not k.endswith(_CLIP_UNUSED)]
    if not any(k.endswith("embeddings.token_embedding.weight") for k in keys):
        raise _wrong_file(what, file, expected, "it has no embeddings.token_embedding.weight")

    def plan_of(config: dict) -> _Plan:
        return _Plan(
            "text_encoder", what, file, keys, config, names.with_text_model_prefix, _build_clip
        )

    def derive() -> dict:
        shapes = convert_shapes(names.with_text_model_prefix, {k: file.shape(k) for k in keys})
        try:
            config = shape_configs.text_config_from_shapes(shapes, flux_shapes.clip_l_config())
        except (KeyError, ValueError, IndexError) as exc:
            raise _wrong_file(what, file, expected, f"it lacks {exc}") from None
        _note_derived(what, file, config, flux_shapes.clip_l_config(), "num_attention_heads")
        return config

    return _config_for("text_encoder", plan_of, file, derive)


def _build_clip(config: dict) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(**config))


# --- T5 -----------------------------------------------------------------------------------------

_T5_EMBED = "shared.weight"
_T5_EMBED_ALIAS = "encoder.embed_tokens.weight"


def plan_t5(file: CheckpointFile) -> _Plan:
    what, expected = "t5xxl", "the T5-XXL text encoder"
    _refuse_scaled_fp8(file, what)
    present = set(file.keys())
    if not any(k.startswith("encoder.block.0.layer.0.SelfAttention.") for k in present):
        raise _wrong_file(what, file, expected, "it has no encoder.block.0.layer.0.SelfAttention")
    if _T5_EMBED not in present and _T5_EMBED_ALIAS not in present:
        raise _wrong_file(what, file, expected, f"it has neither {_T5_EMBED} nor {_T5_EMBED_ALIAS}")
    # A whole T5 (encoder and decoder) also works: the decoder is left out. transformers 5 ties
    # the embedding to both names; files carry one of them, or both.
    embed = _T5_EMBED if _T5_EMBED in present else _T5_EMBED_ALIAS
    keys = [
        k
        for k in file
        if not k.startswith(("decoder.", "lm_head."))
        and (k == embed or k not in (_T5_EMBED, _T5_EMBED_ALIAS))
    ]

    def convert(state):
        out = dict(state)
        tensor = out.pop(embed)
        return {_T5_EMBED: tensor, _T5_EMBED_ALIAS: tensor, **out}

    def plan_of(config: dict) -> _Plan:
        return _Plan("text_encoder_2", what, file, keys, config, convert, _build_t5)

    def derive() -> dict:
        shapes = convert_shapes(convert, {k: file.shape(k) for k in keys})
        try:
            return t5_config_from_shapes(shapes)
        except (KeyError, ValueError, IndexError, StopIteration) as exc:
            raise _wrong_file(what, file, expected, f"it lacks {exc}") from None

    return _config_for("text_encoder_2", plan_of, file, derive)


def _build_t5(config: dict) -> torch.nn.Module:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**config))


def t5_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """T5Config kwargs for T5EncoderModel-named shapes: T5 v1.1 XXL's config with the sizes the
    tensors show (vocabulary, widths, heads, layers); every T5 size is visible in a shape."""
    attention = "encoder.block.0.layer.0.SelfAttention."
    vocab, d_model = shapes[_T5_EMBED]
    buckets, heads = shapes[attention + "relative_attention_bias.weight"]
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in shapes
    d_ff = shapes[
        "encoder.block.0.layer.1.DenseReluDense." + ("wi_0" if gated else "wi") + ".weight"
    ]
    layers = 1 + max(
        int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.block\.(\d+)\.", k))
    )
    base = flux_shapes.t5_xxl_config()
    return {
        **base,
        "vocab_size": vocab,
        "d_model": d_model,
        "d_kv": shapes[attention + "q.weight"][0] // heads,
        "d_ff": d_ff[0],
        "num_layers": layers,
        "num_decoder_layers": layers,
        "num_heads": heads,
        "relative_attention_num_buckets": buckets,
        "feed_forward_proj": base["feed_forward_proj"] if gated else "relu",
    }


# --- AE -----------------------------------------------------------------------------------------


def plan_ae(file: CheckpointFile) -> _Plan:
    what, expected = "ae", "the FLUX.1 autoencoder"
    _refuse_scaled_fp8(file, what)
    keys = file.keys()
    prefix = next(
        (p for p in ("first_stage_model.", "vae.") if any(k.startswith(p) for k in keys)), ""
    )
    keys = [k for k in keys if k.startswith(prefix)]
    stripped = [k[len(prefix) :] for k in keys]
    if any(k.startswith("encoder.down.") for k in stripped):

        def rename(state):
            return ae_from_original(state)
    elif any(k.startswith("encoder.down_blocks.") for k in stripped):

        def rename(state):
            return dict(state)
    else:
        raise _wrong_file(
            what, file, expected, "it has no encoder.down.0.* (nor encoder.down_blocks.0.*)"
        )

    def convert(state):
        return rename({k[len(prefix) :]: v for k, v in state.items()})

    def plan_of(config: dict) -> _Plan:
        return _Plan("vae", what, file, keys, config, convert, _build_ae)

    def derive() -> dict:
        try:
            shapes = convert_shapes(convert, {k: file.shape(k) for k in keys})
            config = ae_config_from_shapes(shapes)
        except (KeyError, ValueError, IndexError) as exc:
            raise _wrong_file(
                what, file, expected, f"its keys do not fit ({one_line(exc)})"
            ) from None
        latent = flux_shapes.LATENT_CHANNELS
        if config["latent_channels"] != latent or config["use_quant_conv"]:
            raise _wrong_file(
                what, file, expected,
                f"its latents have {config['latent_channels']} channels"
                f"{' and it has quant convs' if config['use_quant_conv'] else ''}, FLUX.1's "
                f"{latent} and none (an SD VAE?)",
            )  # fmt: skip
        _note_derived(what, file, config, flux_shapes.ae_config(), "norm_num_groups")
        return config

    return _config_for("vae", plan_of, file, derive)


def _build_ae(config: dict) -> torch.nn.Module:
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_config(config)


def ae_config_from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """AutoencoderKL kwargs for diffusers-named shapes: the FLUX.1 AE's config with the sizes
    the tensors show. GroupNorm's group count does not show: 32 where it divides every width."""
    levels = 1 + max(
        int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.down_blocks\.(\d+)\.", k))
    )
    channels = [shapes[f"encoder.down_blocks.{i}.resnets.0.conv1.weight"][0] for i in range(levels)]
    per_block = len(
        {k.split(".")[4] for k in shapes if k.startswith("encoder.down_blocks.0.resnets.")}
    )
    base = flux_shapes.ae_config()
    groups = base["norm_num_groups"]
    if any(c % groups for c in channels):
        groups = math.gcd(groups, *channels)
    return {
        **base,
        "in_channels": shapes["encoder.conv_in.weight"][1],
        "out_channels": shapes["decoder.conv_out.weight"][0],
        "block_out_channels": tuple(channels),
        "down_block_types": ("DownEncoderBlock2D",) * levels,
        "up_block_types": ("UpDecoderBlock2D",) * levels,
        "layers_per_block": per_block,
        "latent_channels": shapes["decoder.conv_in.weight"][1],
        "norm_num_groups": groups,
        "use_quant_conv": "quant_conv.weight" in shapes,
        "use_post_quant_conv": "post_quant_conv.weight" in shapes,
        "mid_block_add_attention": any(
            k.startswith("encoder.mid_block.attentions.") for k in shapes
        ),
    }


def load_flux_ae(path: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """A FLUX.1 AE file (BFL's ae.safetensors names or diffusers'), frozen, in ``dtype``."""
    file = _open(Path(path).expanduser().absolute(), "ae")
    with offline():
        return _load_plan(plan_ae(file), dtype)
