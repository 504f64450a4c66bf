"""kohya-ss sd-scripts compatibility: keys we know but do not support, aliases and conveniences.

A kohya key whose value means "off" (``cache_latents = false``) changes nothing, so it is accepted
and dropped; any other value is an error that says what is missing, never silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from library.config import musubi_args, musubi_dataset
from library.config.adapter_schema import BLOCKWISE_KEYS, LYCORIS_KEYS
from library.config.kohya_script_keys import FULL_FINE_TUNE, NEWER_UNSUPPORTED, OTHER_TRAININGS
from library.config.suggest import show_value
from library.config.unsupported import Unsupported
from library.config.unsupported import group as _group
from library.errors import ConfigError
from library.models.families.family_entry import KohyaVocabulary
from library.models.families.registry import FAMILIES


def _of_families(table: Callable[[KohyaVocabulary], Mapping[str, Any]]) -> dict[str, Any]:
    """One of the registered families' kohya tables, all merged (in registry order)."""
    return {key: value for entry in FAMILIES for key, value in table(entry.kohya).items()}


_HUB = "difftune never uses the network; upload the saved files yourself"
_DEEPSPEED = "it only tunes DeepSpeed itself; difftune shards with FSDP2 (fsdp)"

UNSUPPORTED: dict[str, Unsupported] = {
    **_group(
        "lowram highvram",
        "difftune places the models itself, and this changes no result",
        (False,),
        ignored=True,
    ),
    "debug_dataset": Unsupported(
        "use --dry_run to check the data and see the plan", (False,), planned=False
    ),
    **_group(
        "cache_info disable_mmap_load_safetensors",
        "it only tunes how sd-scripts reads its files",
        (False,),
        ignored=True,
    ),
    "config_file": Unsupported("a config file cannot name another config file", ignored=True),
    "skip_cache_check": Unsupported(
        "difftune checks every cache entry against the image's content", (False,), planned=False
    ),
    "weighted_captions": Unsupported("(word:1.2) caption weights are planned", (False,)),
    "face_crop_aug_range": Unsupported("face crop augmentation is planned"),
    "masked_loss": Unsupported(
        "masks from conditioning images are planned; alpha_mask takes the mask from the image",
        (False,),
    ),
    "conditioning_data_dir": Unsupported(
        "it gives ControlNet's conditioning images, which difftune does not train, or the masks "
        "of masked_loss, which are planned (alpha_mask takes the mask from the image)"
    ),
    "dataset_class": Unsupported("custom dataset classes are not supported", planned=False),
    "resize_interpolation": Unsupported("choosing the resize filter is planned", ("",)),
    "save_n_epoch_ratio": Unsupported("use save_every_n_epochs", (0,)),
    "huggingface_repo_id": Unsupported(_HUB, ("",), planned=False),
    # without a repo id sd-scripts uploads nothing either: these settings do nothing
    **_group(
        "save_state_to_huggingface resume_from_huggingface async_upload",
        "they only act with huggingface_repo_id",
        (False,),
        ignored=True,
    ),
    **_group(
        "huggingface_repo_type huggingface_path_in_repo huggingface_token "
        "huggingface_repo_visibility",
        "they only act with huggingface_repo_id",
        ("",),
        ignored=True,
    ),
    "output_config": Unsupported("use --print_config", (False,), planned=False),
    "log_tracker_config": Unsupported("a tracker config file is planned", ("",)),
    "console_log_level": Unsupported(
        "it only sets how much sd-scripts prints; difftune prints its plan, warnings and errors",
        ("",),
        ignored=True,
    ),
    "console_log_file": Unsupported(
        "difftune prints to the terminal; to keep a log file, redirect it (2>&1 | tee train.log)",
        ("",),
        planned=False,
    ),
    "console_log_simple": Unsupported(
        "difftune prints plain lines, never rich formatting", (False, True), ignored=True
    ),
    "network_dropout": Unsupported("dropout in LoRA layers is planned", (0,)),
    "dim_from_weights": Unsupported("set network_dim to the rank of network_weights", (False,)),
    "base_weights": Unsupported("merging other LoRA files into the model is planned", ([],)),
    "base_weights_multiplier": Unsupported("only used with base_weights", ignored=True),
    "network_multiplier": Unsupported("a training multiplier other than 1 is planned", (1,)),
    # train_db.py's: it stops training the text encoder after that many steps. sd-scripts' LoRA
    # scripts never read it (the kohya_ss GUI writes it into LoRA configs all the same), and
    # difftune's full fine-tune never trains the text encoders.
    "stop_text_encoder_training": Unsupported(
        "only sd-scripts' train_db.py reads it, to stop training the text encoder early; its LoRA "
        "scripts ignore it and difftune's full fine-tune never trains the text encoders",
        ("",),
        ignored=True,
    ),
    "lr_scheduler_type": Unsupported(
        "custom scheduler classes are not supported", ("",), planned=False
    ),
    "use_8bit_adam": Unsupported('use optimizer_type = "AdamW8bit"', (False,), planned=False),
    "use_lion_optimizer": Unsupported('use optimizer_type = "Lion"', (False,), planned=False),
    "fused_backward_pass": Unsupported("fused optimizer steps are planned", (False,)),
    "fused_optimizer_groups": Unsupported("fused optimizer steps are planned", (0,)),
    "deepspeed": Unsupported(
        'true trains with PyTorch\'s FSDP2 sharding instead: fsdp = "shard_grad_op" (zero_stage '
        '1 or 2, the default) or "full_shard" (zero_stage 3)',
        (False,),
        translated=True,
    ),
    "zero_stage": Unsupported(
        "with deepspeed = true, picks the fsdp value (0: no sharding); ignored without it",
        (2,),
        translated=True,
    ),
    # what else DeepSpeed reads:
    **_group(
        "offload_optimizer_nvme_path offload_param_nvme_path zero3_init_flag "
        "zero3_save_16bit_model",
        _DEEPSPEED,
        ignored=True,
    ),
    **_group(
        "offload_optimizer_device offload_param_device",
        "offloading sharded weights or optimizer state to host memory is planned",
        ("", "none"),
    ),
    "fp16_master_weights_and_gradients": Unsupported(
        "trained weights stay float32 (or bfloat16 with full_bf16)", (False,), planned=False
    ),
    "torch_compile": Unsupported("torch.compile is planned", (False,)),
    # musubi-tuner's default is "NO"
    "dynamo_backend": Unsupported(
        "only used with torch_compile", ("no", "NO", "inductor"), ignored=True
    ),
    **_group("initial_epoch initial_step", "use resume to continue from a saved state"),
    "skip_until_initial_step": Unsupported("use resume to continue from a saved state", (False,)),
    "no_token_padding": Unsupported("prompts are always padded to 77 tokens", (False,)),
    # options of the registered families' own scripts (flux_train_network.py, ...)
    **_of_families(lambda kohya: kohya.options),
    # options of the other scripts (kohya_script_keys): other trainings and newer releases
    **FULL_FINE_TUNE,
    **OTHER_TRAININGS,
    **NEWER_UNSUPPORTED,
    # musubi-tuner's dataset keys for videos and FramePack, and its training options
    **musubi_dataset.UNSUPPORTED,
    **musubi_args.UNSUPPORTED,
}

# kohya's misspellings and old names that mean one of our keys.
ALIASES: dict[str, str] = {
    "caption_extention": "caption_extension",
    **musubi_dataset.ALIASES,
    **musubi_args.ALIASES,
    **_of_families(lambda kohya: kohya.aliases),
}

# Values of supported keys that are valid in kohya but not (yet) here: key -> value -> reason.
UNSUPPORTED_VALUES: dict[str, dict[str, str]] = {
    "optimizer_type": {
        **{
            n: "D-Adaptation's package is unmaintained; Prodigy, its successor, is supported"
            for n in [
                "dadaptation",
                "dadaptadam",
                "dadaptadagrad",
                "dadaptadan",
                "dadaptadanip",
                "dadaptlion",
                "dadaptsgd",
            ]
        },
    },
    "network_module": {
        "networks.dylora": "DyLoRA is planned",
        "networks.oft": "OFT is planned",
        "networks.lora_fa": "LoRA-FA is planned",
    },
    "algo": {
        name: f"LyCORIS' {label} is not supported; difftune trains lora (LoCon), loha and lokr"
        for name, label in {
            "ia3": "IA3",
            "dylora": "DyLoRA",
            "glora": "GLoRA",
            "full": "native fine-tuning",
            "diag-oft": "Diag-OFT",
            "oft": "OFT",
            "boft": "BOFT",
            "tlora": "T-LoRA",
        }.items()
    },
    "save_model_as": {
        "ckpt": "difftune saves .safetensors only",
        "pt": "difftune saves .safetensors only",
        "diffusers": "saving a diffusers folder is planned",
        "diffusers_safetensors": "saving a diffusers folder is planned",
    },
}
# musubi-tuner's values of the same keys (its timestep draws, network modules, ...)
UNSUPPORTED_VALUES = {
    key: {**UNSUPPORTED_VALUES.get(key, {}), **musubi_args.UNSUPPORTED_VALUES.get(key, {})}
    for key in {**UNSUPPORTED_VALUES, **musubi_args.UNSUPPORTED_VALUES}
}

# The schema's spelling of optimizer names; kohya matches them case-insensitively.
OPTIMIZERS = {
    n.lower(): n
    for n in [
        "AdamW",
        "AdamW8bit",
        "PagedAdamW",
        "PagedAdamW8bit",
        "PagedAdamW32bit",
        "Lion",
        "Lion8bit",
        "PagedLion8bit",
        "SGDNesterov",
        "SGDNesterov8bit",
        "Prodigy",
        "Adafactor",
        "AdamWScheduleFree",
        "RAdamScheduleFree",
        "SGDScheduleFree",
    ]
}

SUPPORTED_NETWORK_ARGS = (
    "conv_dim",
    "conv_alpha",
    "loraplus_lr_ratio",
    "loraplus_unet_lr_ratio",
    "loraplus_text_encoder_lr_ratio",
    # the arguments of the families' own networks (split_qkv, ...), read into [flow]
    *dict.fromkeys(arg for entry in FAMILIES for arg in entry.kohya.network_args),
    *LYCORIS_KEYS,
    *BLOCKWISE_KEYS,
)
# LyCORIS' older spellings, read as the key they stand for (its own deprecation table).
NETWORK_ARG_ALIASES = {"use_cp": "use_tucker", "use_conv_cp": "use_tucker"}
_DROPOUT = "dropout inside adapters is planned"
# network_args difftune does not implement, accepted when they are off (the GUIs write every
# option, off or not): key -> (the values that mean off, why another value is refused).
_OFF_NETWORK_ARGS: dict[str, tuple[tuple[object, ...], str]] = {
    "dropout": ((0, None), _DROPOUT),
    "rank_dropout": ((0, None), _DROPOUT),
    "module_dropout": ((0, None), _DROPOUT),
    # only scales rank dropout, which is off whenever this is accepted
    "rank_dropout_scale": ((True, False, None), _DROPOUT),
    "bypass_mode": ((False, None), "LyCORIS' bypass mode is not supported"),
    "train_norm": ((False, None), "LyCORIS' norm-layer adapters are planned"),
    # options of LyCORIS algorithms difftune refuses anyway (OFT, DyLoRA, IA3)
    "constraint": ((0, None), "it belongs to LyCORIS' OFT algorithms, which are not supported"),
    "constrain": ((0, None), "it belongs to LyCORIS' OFT algorithms, which are not supported"),
    "rescaled": ((False, None), "it belongs to LyCORIS' OFT algorithms, which are not supported"),
    "block_size": ((4, None), "it belongs to LyCORIS' DyLoRA, which is not supported"),
    "train_on_input": ((False, None), "it belongs to LyCORIS' IA3, which is not supported"),
    **_of_families(lambda kohya: kohya.off_network_args),
    **musubi_args.OFF_NETWORK_ARGS,
}
_NETWORK_ARG_REASONS = {
    **_of_families(lambda kohya: kohya.refused_network_args),
    **musubi_args.REFUSED_NETWORK_ARGS,
    "disable_conv_cp": "LyCORIS reads it inconsistently; write use_tucker instead",
}
def same_value(value: object, other: object) -> bool:
    """Equal as TOML values: 1 and 1.0 are the same number, but true is not 1 (Python says so)."""
    if isinstance(value, bool) or isinstance(other, bool):
        return type(value) is type(other) and value == other
    if isinstance(other, (int, float)):
        return isinstance(value, (int, float)) and value == other
    return type(value) is type(other) and value == other


def ignored_notice(key: str, value: object) -> str | None:
    """The note shown when an ignored key has a value other than "off" (None: say nothing)."""
    entry = UNSUPPORTED[key]
    if not entry.ignored or not entry.off or any(same_value(value, off) for off in entry.off):
        return None
    return f"{key} = {show_value(value)} is ignored: {entry.reason}"


def unsupported_problem(key: str, value: object, shown: str | None = None) -> str | None:
    """None when ``key = value`` changes nothing (drop it), else why it is rejected.

    ``key`` must be in UNSUPPORTED; ``shown`` is the name used in the message (default: key).
    """
    entry = UNSUPPORTED[key]
    if entry.ignored or any(same_value(value, off) for off in entry.off):
        return None
    verb = "is not supported yet" if entry.planned else "is not supported"
    # An empty string is "unset" in kohya; suggesting to set it to "" would read oddly.
    off = [v for v in entry.off if v != ""]
    fix = "remove it" + (f" or set it to {show_value(off[0])}" if off else "")
    return f'"{shown or key}" {verb} ({entry.reason}); {fix}'


def unsupported_value_problem(key: str, value: object) -> str | None:
    """Why ``value`` of a supported key is rejected, or None when it is not a known kohya value."""
    if not isinstance(value, str):
        return None
    reason = UNSUPPORTED_VALUES.get(key, {}).get(value.lower())
    if reason is None:
        return None
    return f'{key} = "{value}" is not supported ({reason})'


def normalise_optimizer(name: object) -> object:
    """kohya spells optimizer names in any case: "adamw8bit" -> "AdamW8bit"; others unchanged."""
    return OPTIMIZERS.get(name.lower(), name) if isinstance(name, str) else name


def _parse_scalar(text: str) -> object:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def parse_kv_args(items: list[str], name: str = "optimizer_args") -> dict[str, object]:
    """Parse kohya's ``["k=v", ...]`` into a dict of Python values.

    Values become bools (true/false, any case), None ("None"), ints, floats, quoted or bare
    strings, and tuples for comma-separated values ("betas=0.9,0.99" or "betas=(0.9,0.99)").
    Raises ConfigError naming the bad item (``name`` is the key shown in the message).
    """
    result: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=") if isinstance(item, str) else ("", "", "")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise ConfigError(f'{name} item {show_value(item)} is not "key=value"')
        if key in result:
            raise ConfigError(f'{name} sets "{key}" twice')
        if text[0] + text[-1] in ("()", "[]"):
            text = text[1:-1].rstrip(",")
        parts = [p.strip() for p in text.split(",")]
        if len(parts) > 1 and not all(parts):
            raise ConfigError(f"{name} item {show_value(item)} has an empty value in its list")
        values = tuple(_parse_scalar(p) for p in parts)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ConfigError(f"{name} item {show_value(item)} is not a finite number")
        result[key] = values if len(values) > 1 or "," in text else values[0]
    return result


def network_args_values(items: list[str]) -> dict[str, object]:
    """SUPPORTED_NETWORK_ARGS from kohya's network_args (aliases read as their key, arguments
    that are off dropped); ConfigError for any other argument."""
    values: dict[str, object] = {}
    for item in items:
        ((given, value),) = parse_kv_args([item], "network_args").items()
        key = NETWORK_ARG_ALIASES.get(given, given)
        if key in _OFF_NETWORK_ARGS:
            off, reason = _OFF_NETWORK_ARGS[key]
            if any(same_value(value, o) for o in off):
                continue
            raise ConfigError(
                f'network_args "{item}" is not supported ({reason}); remove it'
                + (f" or set {given}={show_value(off[0])}" if off[0] is not None else "")
            )
        if key not in SUPPORTED_NETWORK_ARGS:
            known = ", ".join(SUPPORTED_NETWORK_ARGS)
            reason = _NETWORK_ARG_REASONS.get(key, f"difftune knows {known}")
            raise ConfigError(f'network_args "{item}" is not supported yet ({reason}); remove it')
        problem = unsupported_value_problem(key, value)
        if problem:
            raise ConfigError(f'network_args "{item}": {problem}')
        value = list(value) if isinstance(value, tuple) else value
        if key in values:
            if key == "use_tucker" and isinstance(value, bool):
                # LyCORIS reads use_tucker, use_cp and use_conv_cp and takes any that is on
                value = value or values[key]
            elif not same_value(values[key], value):
                raise ConfigError(
                    f'network_args sets "{key}" twice, to {show_value(values[key])} and '
                    f"{show_value(value)}; keep one"
                )
        values[key] = value
    return values


# kohya's ZeRO stage -> the fsdp value that shards as much or more: stage 0 is plain data
# parallelism; 1 (optimizer state) and 2 (plus gradients) keep whole weights through the step,
# as shard_grad_op does between a block's forward and backward pass; 3 shards them too.
ZERO_STAGES = {0: "no", 1: "shard_grad_op", 2: "shard_grad_op", 3: "full_shard"}
KOHYA_ZERO_STAGE = 2  # sd-scripts' default


def deepspeed_to_fsdp(
    deepspeed: object, zero_stage: object, fsdp: object | None
) -> tuple[str | None, str | None]:
    """(the fsdp value kohya's deepspeed and zero_stage mean, or None for none; a problem).
    ``fsdp`` is the fsdp key's own value when the files also give it."""
    if deepspeed in (False, "", None):
        return None, None
    if deepspeed is not True:
        return None, f"deepspeed = {deepspeed!r}: give true or false"
    stage = KOHYA_ZERO_STAGE if zero_stage in ("", None) else zero_stage
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        return None, f"zero_stage = {stage!r}: give 0, 1, 2 or 3"
    mapped = ZERO_STAGES[stage]
    if fsdp is not None and fsdp != mapped:
        return None, (
            f'deepspeed with zero_stage = {stage} means fsdp = "{mapped}", but fsdp = '
            f'"{fsdp}" is set too; keep one of them'
        )
    return mapped, None
