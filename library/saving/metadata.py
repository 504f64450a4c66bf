"""The safetensors metadata of saved files: kohya's ss_* keys and Stability's modelspec.* keys.

All values are strings (a safetensors header only holds strings); nested values are JSON. Values
that are unset are written as "None", as kohya does, because readers already expect that.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from library.config.schema import Config

MODELSPEC_VERSION = "1.0.1"
IMPLEMENTATION = "diffusers"  # the UNet we train is diffusers' UNet2DConditionModel
# A full checkpoint is saved in the original layout, which kohya labels with Stability's code
ORIGINAL_LAYOUT = "https://github.com/Stability-AI/generative-models"
# What kohya keeps with --no_metadata: what a loader needs to rebuild the network.
MINIMUM_KEYS = (
    "ss_v2",
    "ss_base_model_version",
    "ss_network_module",
    "ss_network_dim",
    "ss_network_alpha",
    "ss_network_args",
    "ss_session_id",  # lets a resume recognise its own files; a random number, nothing personal
)
_OPTIMIZER_CLASSES = {
    "adamw": "torch.optim.adamw.AdamW",
    "adamw8bit": "bitsandbytes.optim.adamw.AdamW8bit",
}


class Family(Protocol):
    """The fields of library.models.families.base.ModelFamily that metadata needs."""

    v2: bool
    prediction_type: str
    base_model_version: str
    modelspec_architecture: str

    def metadata_keys(self, config: Config) -> dict[str, Any]: ...


@dataclass
class RunInfo:
    """Facts of the run that are not in the config (counts, progress, dataset statistics)."""

    num_train_images: int
    num_reg_images: int
    num_epochs: int
    epoch: int
    steps: int
    max_train_steps: int
    gradient_accumulation_steps: int
    batch_size_per_device: int
    total_batch_size: int
    training_started_at: float
    training_finished_at: float | None
    tag_frequency: dict[str, dict[str, int]] = field(default_factory=dict)
    dataset_dirs: dict[str, dict] = field(default_factory=dict)
    sd_model_name: str = ""
    resolution: tuple[int, int] = (512, 512)
    # kohya's ss_bucket_info: {"buckets": {"0": {"resolution": [w, h], "count": samples}}}
    bucket_info: dict | None = None
    session_id: str | None = None  # kohya's ss_session_id: the run's id, kept across resumes
    resume_changes: list = field(default_factory=list)  # settings changed at resumes


def _arg_text(value: object) -> str:
    """A config value as kohya's network_args writes it ("True", "1,2,3", "0.5")."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def network_args(config: Config) -> dict[str, str]:
    """kohya's network_args as a dict of strings, with conv_dim/conv_alpha and the [adapter]
    keys from the config (keys written outside network_args included)."""
    args: dict[str, str] = {}
    for item in config.network.network_args:
        key, _, value = item.partition("=")
        args[key.strip()] = value.strip()
    for key, value in config.adapter.model_dump().items():
        if value is not None:
            args.setdefault(key, _arg_text(value))
    if config.network.network_module == "lycoris.kohya":
        # LyCORIS' conv rank and alpha default to the linear ones: say what trained.
        net = config.network
        args.setdefault("algo", "lora")
        args["conv_dim"] = str(net.conv_dim or net.network_dim)
        args["conv_alpha"] = str(net.conv_alpha or net.network_alpha)
        return args
    if config.network.conv_dim is not None:
        args["conv_dim"] = str(config.network.conv_dim)
    if config.network.conv_alpha is not None:
        args["conv_alpha"] = str(config.network.conv_alpha)
    elif config.network.conv_dim is not None:
        # the alpha that trained, so the file says what it holds where the default applied
        args.setdefault("conv_alpha", "1.0")
    return args


def _optimizer_name(config: Config) -> str:
    """kohya's ss_optimizer: the optimizer class path, then its arguments in parentheses."""
    opt = config.optimizer
    name = _OPTIMIZER_CLASSES.get(opt.optimizer_type.lower(), opt.optimizer_type)
    if isinstance(opt.optimizer_args, dict):
        items = [f"{k}={v}" for k, v in opt.optimizer_args.items()]
    else:
        items = [item.replace(" ", "") for item in opt.optimizer_args]
    return f"{name}({','.join(items)})" if items else name


def _modelspec(
    config: Config,
    architecture: str,
    family: Family,
    run: RunInfo,
    implementation: str = IMPLEMENTATION,
) -> dict[str, str]:
    saving = config.saving
    width, height = run.resolution
    spec = {
        "modelspec.sai_model_spec": MODELSPEC_VERSION,
        "modelspec.architecture": architecture,
        "modelspec.implementation": implementation,
        "modelspec.title": saving.metadata_title or saving.output_name,
        "modelspec.date": datetime.fromtimestamp(int(time.time())).isoformat(),
        "modelspec.resolution": f"{width}x{height}",
    }
    # Flow-matching models have no prediction type in modelspec (kohya leaves it out for Flux).
    if family.prediction_type != "flow":
        spec["modelspec.prediction_type"] = "v" if family.prediction_type == "v_prediction" else "epsilon"
    optional = {
        "modelspec.author": saving.metadata_author,
        "modelspec.description": saving.metadata_description,
        "modelspec.license": saving.metadata_license,
        "modelspec.tags": saving.metadata_tags,
        "modelspec.usage_hint": saving.metadata_usage_hint,
        "modelspec.trigger_phrase": saving.metadata_trigger_phrase,
        "modelspec.thumbnail": saving.metadata_thumbnail,
        "modelspec.merged_from": saving.metadata_merged_from,
        "modelspec.preprocessor": saving.metadata_preprocessor,
        "modelspec.is_negative_embedding": saving.metadata_is_negative_embedding,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    return spec


def _training_keys(config: Config, family: Family, run: RunInfo) -> dict[str, Any]:
    """ss_* keys shared by LoRA and full-UNet files (values not yet stringified)."""
    opt, train = config.optimizer, config.training
    width, height = run.resolution
    keys: dict[str, Any] = {
        "ss_base_model_version": family.base_model_version,
        "ss_v2": family.v2,
        "ss_v_parameterization": family.prediction_type == "v_prediction",
        "ss_learning_rate": opt.learning_rate,
        "ss_num_train_images": run.num_train_images,
        "ss_num_reg_images": run.num_reg_images,
        "ss_num_epochs": run.num_epochs,
        "ss_epoch": run.epoch,
        "ss_steps": run.steps,
        "ss_max_train_steps": run.max_train_steps,
        "ss_gradient_accumulation_steps": run.gradient_accumulation_steps,
        "ss_batch_size_per_device": run.batch_size_per_device,
        "ss_total_batch_size": run.total_batch_size,
        "ss_resolution": f"({width}, {height})",
        "ss_mixed_precision": train.mixed_precision,
        "ss_optimizer": _optimizer_name(config),
        "ss_lr_scheduler": opt.lr_scheduler,
        "ss_lr_warmup_steps": opt.lr_warmup_steps,
        "ss_max_grad_norm": opt.max_grad_norm,
        "ss_seed": train.seed,
        "ss_clip_skip": config.model.clip_skip,
        "ss_noise_offset": train.noise_offset,
        "ss_min_snr_gamma": train.min_snr_gamma,
        "ss_prior_loss_weight": train.prior_loss_weight,
        "ss_gradient_checkpointing": train.gradient_checkpointing,
        "ss_training_started_at": run.training_started_at,
        "ss_training_finished_at": run.training_finished_at,
        "ss_output_name": config.saving.output_name,
        "ss_sd_model_name": run.sd_model_name,
        "ss_tag_frequency": json.dumps(run.tag_frequency, ensure_ascii=False),
        "ss_dataset_dirs": json.dumps(run.dataset_dirs, ensure_ascii=False),
    }
    keys.update(family.metadata_keys(config))
    if config.saving.training_comment is not None:
        keys["ss_training_comment"] = config.saving.training_comment
    if run.session_id is not None:
        keys["ss_session_id"] = run.session_id
    if run.resume_changes:  # the file was trained in parts with different settings: say so
        keys["ss_resume_changes"] = json.dumps(run.resume_changes)
    keys.update(_data_keys(config, run))
    return keys


def _data_keys(config: Config, run: RunInfo) -> dict[str, Any]:
    """kohya's dataset ss_* keys, from the first dataset and its first subset (kohya writes the
    values of its one argument set; files of multi-dataset runs keep the first)."""
    dataset = config.datasets[0] if config.datasets else None
    if dataset is None:
        return {}
    subset = dataset.subsets[0]
    keys = {
        "ss_enable_bucket": dataset.enable_bucket,
        "ss_min_bucket_reso": dataset.min_bucket_reso,
        "ss_max_bucket_reso": dataset.max_bucket_reso,
        "ss_bucket_no_upscale": dataset.bucket_no_upscale,
        "ss_cache_latents": config.data.latents_cached,
        "ss_max_token_length": config.model.max_token_length,
        "ss_caption_dropout_rate": subset.caption_dropout_rate,
        "ss_caption_dropout_every_n_epochs": subset.caption_dropout_every_n_epochs,
        "ss_caption_tag_dropout_rate": subset.caption_tag_dropout_rate,
        "ss_shuffle_caption": subset.shuffle_caption,
        "ss_keep_tokens": subset.keep_tokens,
        "ss_flip_aug": subset.flip_aug,
        "ss_color_aug": subset.color_aug,
        "ss_random_crop": subset.random_crop,
    }
    if run.bucket_info is not None:
        keys["ss_bucket_info"] = json.dumps(run.bucket_info)
    return keys


def _strings(values: dict[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else str(v) for k, v in values.items()}


def lora_metadata(config: Config, family: Family, run: RunInfo) -> dict[str, str]:
    """Every ss_* and modelspec.* key of a kohya LoRA file (docs/formats.md, LoRA files).

    With ``no_metadata`` only the keys that describe the network (MINIMUM_KEYS) and the
    modelspec keys are kept, as kohya does, so loaders can still read the file's structure.
    """
    net = config.network
    keys = _training_keys(config, family, run)
    keys.update(
        {
            "ss_network_module": net.network_module,
            "ss_network_dim": net.network_dim,
            "ss_network_alpha": float(net.network_alpha),
            "ss_network_args": json.dumps(network_args(config)),
            "ss_network_train_unet_only": net.network_train_unet_only,
            "ss_network_train_text_encoder_only": net.network_train_text_encoder_only,
            "ss_scale_weight_norms": net.scale_weight_norms,
            "ss_unet_lr": _side_lr(config, net.unet_lr, not net.network_train_text_encoder_only),
            "ss_text_encoder_lr": _side_lr(
                config, net.text_encoder_lr, not net.network_train_unet_only
            ),
        }
    )
    if config.saving.no_metadata:
        keys = {k: keys[k] for k in MINIMUM_KEYS if k in keys}
    architecture = f"{family.modelspec_architecture}/lora"
    # The implementation whose module names the file uses: SGM's for SDXL (ModelFamily).
    implementation = getattr(family, "lora_implementation", IMPLEMENTATION)
    return _strings(keys) | _modelspec(config, architecture, family, run, implementation)


def _side_lr(config: Config, lr: float | list[float] | None, trained: bool) -> float | None:
    """The learning rate a side (UNet or text encoder) trained with; None if not trained.

    A per-encoder list is written as its first rate, as kohya does (readers expect a number).
    """
    if not trained:
        return None
    if isinstance(lr, list):
        return lr[0]
    return config.optimizer.learning_rate if lr is None else lr


def unet_metadata(config: Config, family: Family, run: RunInfo) -> dict[str, str]:
    """Metadata of a fully fine-tuned UNet file: the training ss_* keys and modelspec keys."""
    keys = _training_keys(config, family, run)
    keys["ss_unet_lr"] = _side_lr(config, config.network.unet_lr, True)
    if config.saving.no_metadata:
        keys = {k: keys[k] for k in ("ss_v2", "ss_base_model_version", "ss_session_id") if k in keys}
    implementation = getattr(family, "checkpoint_implementation", ORIGINAL_LAYOUT)
    return _strings(keys) | _modelspec(
        config, family.modelspec_architecture, family, run, implementation
    )
