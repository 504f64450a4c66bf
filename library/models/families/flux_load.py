"""Loading FLUX.1 (dev / schnell): a diffusers FluxPipeline folder, or a single transformer file
with its text encoders and AE as separate files ([flow] clip_l, t5xxl, ae).

The folder is read with from_pretrained. A single transformer file is read as Black Forest Labs
and ComfyUI ship it (``double_blocks.*``, optionally under ``model.diffusion_model.``) or in
diffusers' names; clip_l in transformers' CLIPTextModel names (with or without ``text_model.``),
t5xxl in T5EncoderModel names, ae in BFL's ae.safetensors names or diffusers' AutoencoderKL
names. Each file's config is the one in its metadata (``difftune.config.<part>``, written by
difftune) when it fits, else the full-size FLUX.1 config with the sizes the tensors show
(layer counts, widths), so pruned and tiny models load too. Every file's header and shapes are
checked, and the tokenizers found, before any weight is read; weights stored in fp8, fp16 or
bf16 are cast to the weight dtype on load (CPUs have no fp8 arithmetic).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models import original_names as names
from library.models import shape_configs
from library.models.checkpoint_file import CheckpointFile
from library.models.checkpoint_parts import CONFIG_METADATA, empty_module, shapes_problem
from library.models.flux import shapes as flux_shapes
from library.models.flux.original_keys import (
    FluxKeys,
    ae_from_original,
    convert_shapes,
    detect_flux,
    transformer_from_original,
)
from library.models.loader import (
    LOAD_ERRORS,
    Components,
    load_weights,
    offline,
    one_line,
    read_json,
    resolve_model_dir,
)

FLUX_PIPELINE = "FluxPipeline"
_TRANSFORMER_CLASS = "FluxTransformer2DModel"
# Subfolder -> the file that must be in it. tokenizer_2 (T5) is checked on its own: the CLIP
# tokenizer check would ask a T5 folder for vocab.json + merges.txt.
_REQUIRED = {
    "transformer": "config.json",
    "vae": "config.json",
    "text_encoder": "config.json",
    "text_encoder_2": "config.json",
    "tokenizer": None,
}
# Weights file stem per subfolder (loader.find_weights' names).
_STEMS = {
    "transformer": "diffusion_pytorch_model",
    "vae": "diffusion_pytorch_model",
    "text_encoder": "model",
    "text_encoder_2": "model",
}
# (repo id, subfolder) whose T5 tokenizer fits FLUX.1, for tokenizer_cache_dir and the Hub cache.
_T5_REPOS = (
    ("google/t5-v1_1-xxl", ""),
    ("black-forest-labs/FLUX.1-dev", "tokenizer_2"),
    ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
)
_FLOW_FILES = {
    "clip_l": "the CLIP-L text encoder (clip_l.safetensors)",
    "t5xxl": "the T5-XXL text encoder (e.g. t5xxl_fp16.safetensors)",
    "ae": "the autoencoder (ae.safetensors)",
}


@dataclass
class FluxParts:
    """The modules and tokenizers of one FLUX.1 model, before family and objective are chosen."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    clip_l: torch.nn.Module
    t5: torch.nn.Module
    clip_tokenizer: object
    t5_tokenizer: object
    variant: str  # "dev" or "schnell"
    model_dir: Path  # the diffusers folder, or the transformer file


# --- which models are FLUX.1 ------------------------------------------------------------------


def claims_flux(model: ModelSection, flow: FlowSection) -> bool:
    """True for a FLUX.1 diffusers folder or a .safetensors file holding a FLUX.1 transformer.

    Reads only model_index.json or the file's header. A folder counts when its pipeline class
    is FluxPipeline or its transformer a FluxTransformer2DModel (so FLUX.1 Fill, Kontext, ...
    get load_flux's refusal rather than the SD loader's "lacks unet/").
    """
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        return _is_flux_folder(path)
    if path.is_file() and path.suffix.lower() == ".safetensors":
        return _file_flux_keys(path) is not None
    return False


def _is_flux_folder(path: Path) -> bool:
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # not a folder of ours to judge: the SD loader reports it
    if not isinstance(index, dict):
        return False
    transformer = index.get("transformer")
    return index.get("_class_name") == FLUX_PIPELINE or (
        isinstance(transformer, list) and _TRANSFORMER_CLASS in transformer
    )


def _file_flux_keys(path: Path) -> FluxKeys | None:
    try:
        with safe_open(str(path), framework="pt") as handle:
            keys = list(handle.keys())
    except (SafetensorError, OSError):
        return None
    return detect_flux(keys)


# --- loading ------------------------------------------------------------------------------------


def load_flux(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a FLUX.1 dev or schnell model: a diffusers folder or a transformer file.

    Text encoders and tokenizers are (CLIP-L, T5). Every module is frozen, in eval mode, on the
    CPU, in ``weight_dtype`` (the AE in ``vae_dtype``). ModelError for any problem with the files.
    """
    from library.models.families.flux import flux_family
    from library.models.families.flux_sampling import flux_scheduler_config
    from library.training.objectives import FlowMatchingObjective, FlowOptions

    parts = load_flux_parts(model, flow, weight_dtype, vae_dtype)
    return Components(
        denoiser=parts.transformer,
        vae=parts.vae,
        text_encoders=(parts.clip_l, parts.t5),
        tokenizers=(parts.clip_tokenizer, parts.t5_tokenizer),
        objective=FlowMatchingObjective(
            FlowOptions.from_section(flow), flux_scheduler_config(parts.variant)
        ),
        family=flux_family(parts.variant, flow),
        model_dir=parts.model_dir,
    )


def load_flux_parts(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> FluxParts:
    """The modules and tokenizers of ``load_flux``, with the variant the model is."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        return _load_folder(path, weight_dtype, vae_dtype)
    return _load_files(path, model, flow, weight_dtype, vae_dtype)


def _freeze(*modules: torch.nn.Module) -> None:
    for module in modules:
        module.requires_grad_(False)
        module.eval()


# --- a diffusers folder -------------------------------------------------------------------------


def _load_folder(path: Path, weight_dtype: torch.dtype, vae_dtype: torch.dtype) -> FluxParts:
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    from library.models.loader import check_weights_file, find_weights

    model_dir = resolve_model_dir(str(path), _REQUIRED)
    t5_dir = model_dir / "tokenizer_2"
    if not t5_dir.is_dir():
        raise ModelError(
            f"{model_dir} lacks the tokenizer_2/ subfolder; the diffusers folder is incomplete"
        )
    index = read_json(model_dir / "model_index.json")
    if index.get("_class_name") != FLUX_PIPELINE:
        raise ModelError(
            f"{model_dir} holds a {index.get('_class_name')}; only text-to-image FLUX.1 "
            f"({FLUX_PIPELINE}: dev or schnell) can be trained"
        )
    config = read_json(model_dir / "transformer" / "config.json")
    _refuse_channels(model_dir / "transformer", config.get("in_channels", 64))
    variant = "dev" if config.get("guidance_embeds", False) else "schnell"
    # Every weights file is found and its header checked before minutes of loading start.
    for sub, stem in _STEMS.items():
        for file in find_weights(model_dir / sub, stem)[0]:
            check_weights_file(file)
    t5_tokenizer_dir = _t5_tokenizer_files(t5_dir, "the diffusers folder is incomplete")
    clip_config = {
        **flux_shapes.clip_l_config(),
        **read_json(model_dir / "text_encoder" / "config.json"),
    }
    t5_config = {
        **flux_shapes.t5_xxl_config(),
        **read_json(model_dir / "text_encoder_2" / "config.json"),
    }
    with offline():
        # Tokenizers first: a broken one fails in a second, not after the weights.
        clip_tokenizer = _clip_tokenizer(model_dir / "tokenizer", clip_config)
        t5_tokenizer = _t5_tokenizer(t5_tokenizer_dir, t5_config["vocab_size"])
        transformer, vae, clip_l, t5 = (
            load_weights(cls, model_dir, sub, dtype, _STEMS[sub])
            for cls, sub, dtype in (
                (FluxTransformer2DModel, "transformer", weight_dtype),
                (AutoencoderKL, "vae", vae_dtype),
                (CLIPTextModel, "text_encoder", weight_dtype),
                (T5EncoderModel, "text_encoder_2", weight_dtype),
            )
        )
    _freeze(transformer, vae, clip_l, t5)
    return FluxParts(transformer, vae, clip_l, t5, clip_tokenizer, t5_tokenizer, variant, model_dir)


def _refuse_channels(where: Path, channels: int) -> None:
    expected = flux_shapes.transformer_config()["in_channels"]
    if channels != expected:
        raise ModelError(
            f"{where} takes {channels} input channels (FLUX.1 Fill or Depth?); only text-to-image "
            f"FLUX.1 models with {expected} (16 latent channels, 2x2 packed) can be trained"
        )


def _clip_tokenizer(folder: Path, config: dict):
    from transformers import CLIPTokenizer

    try:
        tokenizer = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)
    except LOAD_ERRORS + (TypeError,) as exc:
        raise ModelError(
            f"cannot load the tokenizer in {folder}: {one_line(exc)}; it needs vocab.json and "
            "merges.txt (or tokenizer.json)"
        ) from None
    _check_vocab(folder, tokenizer, config["vocab_size"], "CLIP-L")
    # As for SD: a folder without tokenizer_config.json leaves model_max_length "unlimited".
    positions = config["max_position_embeddings"]
    if tokenizer.model_max_length > positions:
        tokenizer.model_max_length = positions
    return tokenizer


def _check_vocab(folder: Path | str, tokenizer, rows: int, encoder: str) -> None:
    """A tokenizer with more ids than the encoder has embeddings is another model's."""
    if len(tokenizer) > rows:
        raise ModelError(
            f"the tokenizer in {folder} has {len(tokenizer)} tokens but the {encoder} encoder "
            f"only {rows} embeddings: it is not {encoder}'s tokenizer; point at the right folder"
        )


# --- T5 tokenizer -------------------------------------------------------------------------------


def _t5_tokenizer_files(folder: Path, fix: str) -> Path:
    """``folder`` after checking it has files transformers can read without sentencepiece."""
    if (folder / "tokenizer.json").is_file():
        return folder
    if (folder / "spiece.model").is_file():
        if importlib.util.find_spec("sentencepiece") is not None:
            return folder
        # transformers 5 converts spiece.model to its fast tokenizer only through the
        # sentencepiece package (without it, it falls back to tiktoken and fails).
        raise ModelError(
            f"{folder} has spiece.model but no tokenizer.json, and reading spiece.model needs "
            "the sentencepiece package, which is not installed; add the tokenizer.json of the "
            "same tokenizer (FLUX.1's tokenizer_2/ has one) or pip install sentencepiece"
        )
    raise ModelError(f"{folder} lacks tokenizer.json (the T5 tokenizer); {fix}")


def find_t5_tokenizer_folder(
    t5_tokenizer_path: str | None, cache_dir: str | None, hub_cache: str | Path | None = None
) -> Path | None:
    """The first local folder with a T5 tokenizer: ``t5_tokenizer_path`` (or its tokenizer_2/),
    else kohya's ``tokenizer_cache_dir`` layout, else the Hugging Face cache. Never downloads."""

    def usable(folder: Path) -> bool:
        return (folder / "tokenizer.json").is_file() or (folder / "spiece.model").is_file()

    if t5_tokenizer_path:
        root = Path(t5_tokenizer_path).expanduser()
        found = [f for f in (root / "tokenizer_2", root) if usable(f)]
        return found[0] if found else None  # an explicit path that does not fit is reported
    if cache_dir:
        for repo, _sub in _T5_REPOS:
            folder = Path(cache_dir).expanduser() / repo.replace("/", "_")
            if usable(folder):
                return folder
    from huggingface_hub import try_to_load_from_cache

    for repo, sub in _T5_REPOS:
        for name in ("tokenizer.json", "spiece.model"):
            try:
                hit = try_to_load_from_cache(repo, f"{sub}/{name}" if sub else name, hub_cache)
            except (OSError, ValueError):
                hit = None
            if isinstance(hit, str):
                return Path(hit).parent
    return None


def _t5_tokenizer(folder: Path, rows: int):
    from transformers import T5TokenizerFast

    try:
        tokenizer = T5TokenizerFast.from_pretrained(str(folder), local_files_only=True)
    except LOAD_ERRORS + (TypeError,) as exc:
        raise ModelError(
            f"cannot load the T5 tokenizer in {folder}: {one_line(exc)}; it needs "
            "tokenizer.json (as FLUX.1's tokenizer_2/ has)"
        ) from None
    _check_vocab(folder, tokenizer, rows, "T5")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ModelError(
            f"the tokenizer in {folder} has no pad or end token; it is not T5's tokenizer"
        )
    # model_max_length stays as the folder says: the family decides how many tokens to use.
    return tokenizer


# --- single files -------------------------------------------------------------------------------


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


def _load_files(
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
        _plan_transformer(transformer_file, found),
        _plan_clip(files["clip_l"]),
        _plan_t5(files["t5xxl"]),
        _plan_ae(files["ae"]),
    ]
    _refuse_channels(path, plans[0].config["in_channels"])
    t5_folder = find_t5_tokenizer_folder(flow.t5_tokenizer_path, model.tokenizer_cache_dir)
    if t5_folder is None:
        raise ModelError(_missing_t5_tokenizer(flow.t5_tokenizer_path, path))
    t5_folder = _t5_tokenizer_files(
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
        _check_vocab(where, clip_tokenizer, clip_config["vocab_size"], "CLIP-L")
        t5_tokenizer = _t5_tokenizer(t5_folder, t5_config["vocab_size"])
        transformer, clip_l, t5 = (_load_plan(p, weight_dtype) for p in plans[:3])
        vae = _load_plan(plans[3], vae_dtype)
    return FluxParts(
        transformer, vae, clip_l, t5, clip_tokenizer, t5_tokenizer, found.variant, path
    )


def _missing_t5_tokenizer(path_text: str | None, model_file: Path) -> str:
    if path_text:
        return (
            f"t5_tokenizer_path {path_text} has no tokenizer.json (nor a tokenizer_2/ subfolder "
            "with one); copy the T5 tokenizer files of a FLUX.1 diffusers folder's tokenizer_2/ "
            "there"
        )
    return (
        f"{model_file.name} carries no T5 tokenizer and none was found locally: set "
        "t5_tokenizer_path in [flow] to a folder with tokenizer.json (a FLUX.1 diffusers "
        "folder's tokenizer_2/, or google/t5-v1_1-xxl's files); tokenizer_cache_dir and the "
        "Hugging Face cache were searched too, nothing is downloaded"
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
    _freeze(module)
    return module


# --- transformer --------------------------------------------------------------------------------


def _plan_transformer(file: CheckpointFile, found: FluxKeys) -> _Plan:
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


def _plan_clip(file: CheckpointFile) -> _Plan:
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


def _plan_t5(file: CheckpointFile) -> _Plan:
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


def _plan_ae(file: CheckpointFile) -> _Plan:
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
        return _load_plan(_plan_ae(file), dtype)
