"""Load an SD 1.x / 2.x / SDXL model, offline, frozen, in one dtype (the VAE may stay float32).

From a local diffusers folder here, or from a single-file checkpoint (library/models/
single_file.py). Every way a user's model can be wrong (missing, a missing part, a truncated
weights file) becomes a one-line ModelError naming the path and the fix, checked before any
weights are read where possible. The model options of ModelSection act here too: ``vae``
replaces the VAE, ``no_half_vae`` keeps it float32, ``zero_terminal_snr`` rescales the noise
schedule.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from library.config.schema import ModelSection
from library.errors import ConfigError, ModelError
from library.models.family import ModelFamily, detect_family

# Subfolder -> the file that must be in it. CLIP tokenizers come as vocab.json + merges.txt,
# tokenizer.json, or both, so the tokenizer has its own check.
_REQUIRED = {
    "unet": "config.json",
    "vae": "config.json",
    "text_encoder": "config.json",
    "tokenizer": None,  # see _check_tokenizer_files
    "scheduler": "scheduler_config.json",
}
_SDXL_REQUIRED = {"text_encoder_2": "config.json", "tokenizer_2": None}
_WEIGHT_STEMS = {"unet": "diffusion_pytorch_model", "vae": "diffusion_pytorch_model"}
_LOAD_ERRORS = (
    OSError,
    ValueError,
    RuntimeError,
    KeyError,
    EOFError,
    pickle.UnpicklingError,
    SafetensorError,
)


@dataclass
class Components:
    """The loaded parts of one model. Every module is frozen (requires_grad False), on the CPU,
    in the weight dtype it was loaded with (the VAE in float32 with no_half_vae), in eval mode.

    ``model_dir`` is the diffusers folder, or the checkpoint file of a single-file model.
    SDXL models also have ``text_encoder_2`` (CLIPTextModelWithProjection) and ``tokenizer_2``.
    """

    unet: torch.nn.Module
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: object
    noise_scheduler: object  # diffusers.DDPMScheduler with the family's prediction_type
    family: ModelFamily
    model_dir: Path
    text_encoder_2: torch.nn.Module | None = None
    tokenizer_2: object | None = None

    @property
    def text_encoders(self) -> tuple[torch.nn.Module, ...]:
        """All text encoders, in family.text_encoder_subfolders order."""
        second = (self.text_encoder_2,) if self.text_encoder_2 is not None else ()
        return (self.text_encoder, *second)

    @property
    def tokenizers(self) -> tuple[object, ...]:
        second = (self.tokenizer_2,) if self.tokenizer_2 is not None else ()
        return (self.tokenizer, *second)

    @property
    def is_single_file(self) -> bool:
        """The model came from one checkpoint file (there is no folder to copy parts from)."""
        return self.model_dir.is_file()


def load_components(model: ModelSection, weight_dtype: torch.dtype) -> Components:
    """Load unet, vae, text encoder(s), tokenizer(s) and a DDPM training scheduler.

    From a diffusers folder or a single-file checkpoint; then the ModelSection options (vae,
    no_half_vae, zero_terminal_snr, clip_skip checks). Nothing touches the network. Raises
    ModelError for any problem with the model's files, ConfigError for options that do not fit
    the model.
    """
    from library.models.single_file import is_single_file, load_single_file

    vae_dtype = torch.float32 if model.no_half_vae else weight_dtype
    if is_single_file(model.pretrained_model_name_or_path):
        parts = load_single_file(model, weight_dtype, vae_dtype)
    else:
        parts = _load_folder(model, weight_dtype, vae_dtype)
    _check_options(model, parts.family)
    if model.vae:
        from library.models.vae_file import load_vae

        parts.vae = load_vae(model.vae, parts.vae.config, vae_dtype)
    return parts


def _check_options(model: ModelSection, family: ModelFamily) -> None:
    if model.zero_terminal_snr and not family.v_parameterization:
        raise ConfigError(
            "zero_terminal_snr needs v-prediction: with epsilon prediction the last timestep has "
            "nothing to learn and samplers divide by zero there; set v_parameterization = true "
            "or remove zero_terminal_snr"
        )
    if model.clip_skip and model.clip_skip > 1 and family.uses_pooled_text_embedding:
        raise ConfigError(
            f"clip_skip = {model.clip_skip} applies to SD 1.x/2.x; SDXL conditions on its text "
            "encoders' penultimate layers already; remove clip_skip"
        )


def _load_folder(model: ModelSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype):
    """Components of a local diffusers folder (SD 1.x/2.x, or SDXL with text_encoder_2)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    model_dir = resolve_model_dir(model.pretrained_model_name_or_path)
    unet_config = _read_json(model_dir / "unet" / "config.json")
    scheduler_config = _read_json(model_dir / "scheduler" / "scheduler_config.json")
    model_index = _read_json(model_dir / "model_index.json")
    sdxl = _refuse_unsupported(model_dir, unet_config, model_index)
    family = detect_family(model, unet_config, scheduler_config, model_index)
    second = None
    with offline():
        unet = _load_weights(UNet2DConditionModel, model_dir, "unet", weight_dtype)
        vae = _load_weights(AutoencoderKL, model_dir, "vae", vae_dtype)
        text_encoder = _load_weights(CLIPTextModel, model_dir, "text_encoder", weight_dtype)
        tokenizer = _load_tokenizer(model_dir / "tokenizer", text_encoder)
        if sdxl:
            encoder_2 = _load_weights(
                CLIPTextModelWithProjection, model_dir, "text_encoder_2", weight_dtype
            )
            second = (encoder_2, _load_tokenizer(model_dir / "tokenizer_2", encoder_2))
    modules = (unet, vae, text_encoder, *(second[:1] if second else ()))
    for module in modules:
        module.requires_grad_(False)
        module.eval()
    return Components(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        noise_scheduler=build_noise_scheduler(scheduler_config, family, model.zero_terminal_snr),
        family=family,
        model_dir=model_dir,
        text_encoder_2=second[0] if second else None,
        tokenizer_2=second[1] if second else None,
    )


def build_noise_scheduler(
    scheduler_config: dict, family: ModelFamily, zero_terminal_snr: bool = False
):
    """A DDPMScheduler with the model's beta schedule; training needs only its alphas_cumprod,
    add_noise and get_velocity, whatever sampler the folder ships for inference.

    ``zero_terminal_snr`` rescales the betas so that alphas_cumprod ends at exactly 0 (diffusers'
    rescale_betas_zero_snr, Lin et al. 2023, algorithm 1).
    """
    from diffusers import DDPMScheduler

    return DDPMScheduler.from_config(
        scheduler_config,
        prediction_type=family.prediction_type,
        rescale_betas_zero_snr=zero_terminal_snr,
    )


def model_fingerprint(model_dir: str | Path) -> str:
    """A short stable name of the model for metadata (ss_sd_model_name): its folder name."""
    path = Path(model_dir).expanduser()
    return path.name or path.resolve().name


def resolve_model_dir(path_text: str) -> Path:
    """The model folder as an absolute path, after checking it is a complete diffusers folder."""
    path = Path(path_text).expanduser().absolute()
    if path.is_file():
        raise ModelError(
            f"{path} is neither a diffusers folder nor a .safetensors/.ckpt checkpoint; point "
            "pretrained_model_name_or_path at one of those"
        )
    if not path.is_dir():
        raise ModelError(
            f"model folder {path} does not exist; set pretrained_model_name_or_path to a local "
            "diffusers folder (nothing is downloaded)"
        )
    if not (path / "model_index.json").is_file():
        raise ModelError(
            f"{path} has no model_index.json, so it is not a diffusers model folder; point "
            "pretrained_model_name_or_path at the folder that contains model_index.json"
        )
    required_parts = dict(_REQUIRED)
    if "text_encoder_2" in _read_json(path / "model_index.json"):
        required_parts.update(_SDXL_REQUIRED)
    for sub, required in required_parts.items():
        if not (path / sub).is_dir():
            raise ModelError(
                f"{path} lacks the {sub}/ subfolder; the diffusers folder is incomplete"
            )
        if required and not (path / sub / required).is_file():
            raise ModelError(f"{path / sub} lacks {required}; the diffusers folder is incomplete")
        if sub.startswith("tokenizer"):
            _check_tokenizer_files(path / sub)
    return path


def _check_tokenizer_files(folder: Path) -> None:
    # transformers builds an empty tokenizer from an empty folder without complaint.
    has_bpe = (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    if not (has_bpe or (folder / "tokenizer.json").is_file()):
        raise ModelError(
            f"{folder} lacks vocab.json + merges.txt (or tokenizer.json); the diffusers folder "
            "is incomplete"
        )


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read {path}: {_one_line(exc)}; restore the file") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object; restore the file")
    return data


def _refuse_unsupported(model_dir: Path, unet_config: dict, index: dict) -> bool:
    """Fail early, before minutes of loading, for model kinds this trainer cannot train.

    Returns True for an SDXL folder (two text encoders, size conditioning).
    """
    sdxl = unet_config.get("addition_embed_type") == "text_time" or "text_encoder_2" in index
    if sdxl and "text_encoder_2" not in index:
        raise ModelError(
            f"{model_dir} has an SDXL UNet but no text_encoder_2 (an SDXL refiner?); only SDXL "
            "base models can be trained"
        )
    channels = unet_config.get("in_channels", 4)
    if channels != 4:
        raise ModelError(
            f"{model_dir / 'unet'} takes {channels} input channels (an inpainting or depth "
            "model?); only text-to-image models with 4 latent channels can be trained"
        )
    return sdxl


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Forbid hub access while loading, in case a library would otherwise look something up."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _load_weights(
    cls, model_dir: Path, sub: str, dtype: torch.dtype, stem: str | None = None
) -> torch.nn.Module:
    """Load one model component, after checking its weights files are whole.

    ``stem`` names the weights file (default: by ``sub``, diffusion_pytorch_model or model).
    """
    files, variant = _find_weights(model_dir / sub, stem or _WEIGHT_STEMS.get(sub, "model"))
    for file in files:
        _check_weights_file(file)
    try:
        module = cls.from_pretrained(
            str(model_dir),
            subfolder=sub,
            dtype=dtype,
            variant=variant,
            use_safetensors=files[0].suffix == ".safetensors",
            local_files_only=True,
        )
    except _LOAD_ERRORS as exc:
        names = ", ".join(str(f) for f in files)
        raise ModelError(
            f"cannot load {names}: {_one_line(exc)}; re-download or re-convert the model"
        ) from None
    # Some classes keep chosen layers in float32 on load; the caller asked for one dtype. Cast
    # only then, since diffusers warns about any .to(dtype) of a loaded model.
    tensors = [*module.parameters(), *module.buffers()]
    if any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        module.to(dtype)
    return module


def _find_weights(folder: Path, stem: str) -> tuple[list[Path], str | None]:
    """The weights files from_pretrained will read, and the variant ("fp16") to ask for."""
    for variant in (None, "fp16"):
        infix = f".{variant}" if variant else ""
        single = folder / f"{stem}{infix}.safetensors"
        if single.is_file():
            return [single], variant
        index = folder / f"{stem}.safetensors.index{infix}.json"
        if index.is_file():
            return _shards(index), variant
        pickled = folder / f"{stem}{infix}.bin"
        if pickled.is_file():
            return [pickled], variant
    raise ModelError(
        f"{folder} has no weights file (expected {stem}.safetensors); the diffusers folder is "
        "incomplete"
    )


def _shards(index: Path) -> list[Path]:
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ModelError(f"{index} has no weight_map; restore the file")
    shards = [index.parent / name for name in sorted(set(weight_map.values()))]
    for shard in shards:
        if not shard.is_file():
            raise ModelError(f"{shard} (listed in {index.name}) is missing; re-download the model")
    return shards


def _check_weights_file(file: Path) -> None:
    """safetensors validates its header against the file length: truncation shows up here."""
    if not file.name.endswith(".safetensors"):
        return
    try:
        with safe_open(str(file), framework="pt"):
            pass
    except (SafetensorError, OSError) as exc:
        raise ModelError(
            f"weights file {file} is corrupt or truncated ({_one_line(exc)}); re-download or "
            "re-convert the model"
        ) from None


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _load_tokenizer(folder: Path, text_encoder: torch.nn.Module):
    from transformers import CLIPTokenizer

    try:
        tokenizer = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)
    except _LOAD_ERRORS + (TypeError,) as exc:
        raise ModelError(
            f"cannot load the tokenizer in {folder}: {_one_line(exc)}; it needs vocab.json and "
            "merges.txt (or tokenizer.json)"
        ) from None
    # A folder without tokenizer_config.json leaves model_max_length "unlimited"; the text
    # encoder's position table is the real limit (77 for SD).
    positions = text_encoder.config.max_position_embeddings
    if tokenizer.model_max_length > positions:
        tokenizer.model_max_length = positions
    return tokenizer
