"""What a resume may change, checked before any model loads.

A state folder keeps the resolved config it was trained with (``config.json``). On resume every
difference from the current config is printed. Changes the saved state cannot carry (another
network shape, optimizer or trained precision) are refused; every other change is applied for
real from the resumed step on (a new learning rate, schedule or length, sampling, logging,
saving, caches, precision of the frozen models) and recorded in the saved files' metadata.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from library.config.adapter_schema import LYCORIS_KEYS
from library.config.schema import SECRET_KEYS, Config
from library.errors import CheckpointError
from library.training.plan import RunPlan
from library.training.state import Progress, check_compatible

CONFIG_FILE = "config.json"
STEPS_PER_EPOCH = "steps_per_epoch"  # a change of the images, reported with the settings

# Keys whose change makes the saved weights or optimizer state meaningless for this run.
REFUSED_CHANGES = {
    "train_mode": "the state holds other trained weights",
    "network_module": "the state holds another adapter type",
    "network_dim": "the adapter's rank is fixed by the saved weights",
    "network_alpha": "the adapter's scale is part of the saved weights' meaning",
    "conv_dim": "the conv adapters are fixed by the saved weights",
    "conv_alpha": "the conv adapters' scale is part of the saved weights' meaning",
    "network_train_unet_only": "the state holds weights for other models",
    "network_train_text_encoder_only": "the state holds weights for other models",
    # with text-encoder adapters: those after the conditioning layer get none (a change with
    # frozen text encoders only changes the conditioning, like a caption edit, and is applied)
    "clip_skip": "the trained text-encoder layers depend on it",
    "v2": "the state was trained on another model",
    "v_parameterization": "the state was trained for another prediction target",
    "optimizer_type": "the optimizer state belongs to the saved optimizer",
    "optimizer_args": "the optimizer state was built with the saved arguments",
    "loraplus_lr_ratio": "the optimizer state has other parameter groups",
    "loraplus_unet_lr_ratio": "the optimizer state has other parameter groups",
    "loraplus_text_encoder_lr_ratio": "the optimizer state has other parameter groups",
    "full_bf16": "the saved weights and optimizer state have the saved precision",
    "full_fp16": "the saved weights and optimizer state have the saved precision",
    "ema_decay": "the saved average was made with the saved decay",
    **dict.fromkeys(LYCORIS_KEYS, "the saved LyCORIS adapters were built with the saved value"),
    **dict.fromkeys(
        ("block_dims", "block_alphas", "conv_block_dims", "conv_block_alphas"),
        "the saved adapters have the saved per-block ranks and scales",
    ),
    **dict.fromkeys(
        ("down_lr_weight", "mid_lr_weight", "up_lr_weight", "block_lr_zero_threshold"),
        "the block weights decide which adapters exist and the optimizer's parameter groups",
    ),
}
_REQUIRED = ("global_step", "seed", "train_mode", "steps_per_epoch", "effective_batch_sizes", "world_size")
# Keys that name the run rather than configure it: never reported as changes.
_NOT_SETTINGS = {"resume", "overwrite"} | SECRET_KEYS


def flat_settings(config: Config) -> dict[str, object]:
    """Every setting by its key name (keys are unique across sections), JSON-comparable."""
    dumped = config.model_dump(exclude={"notices", "dataset_defaults"}, mode="json")
    flat: dict[str, object] = {"datasets": dumped.pop("datasets")}
    for values in dumped.values():
        flat.update({k: v for k, v in values.items() if k not in _NOT_SETTINGS})
    return flat


def write_settings(folder: Path, config: Config) -> None:
    """Store the run's settings in a (temporary) state folder."""
    text = json.dumps(flat_settings(config), indent=1, sort_keys=True)
    (folder / CONFIG_FILE).write_text(text, encoding="utf-8")


@dataclass(frozen=True)
class ResumeCheck:
    """What the state folder says about the run it continues."""

    global_step: int
    run_id: str | None
    changes: dict[str, tuple[object, object]]  # key -> (saved, now), all applied


def check_resume(folder: Path, config: Config, plan: RunPlan) -> ResumeCheck:
    """Validate the state's progress and compare its settings; CheckpointError on a refusal."""
    progress = _read_progress(folder)
    step, total_steps = progress["global_step"], plan.total_steps
    saved = Progress(**{k: v for k, v in progress.items() if k in Progress.__dataclass_fields__})
    check_compatible(saved, expected_progress(config, plan), folder)
    if step >= total_steps:
        raise CheckpointError(
            f"resume: {folder} is at optimizer step {step}, and this run ends at step "
            f"{total_steps}; there is nothing left to train. Raise max_train_steps (or "
            "max_train_epochs) to continue it"
        )
    changes = _changes(folder, config)
    if saved.steps_per_epoch != plan.steps_per_epoch:  # the images changed (check_compatible)
        changes = {STEPS_PER_EPOCH: (saved.steps_per_epoch, plan.steps_per_epoch), **changes}
    _check_adapter_kind(folder, changes)
    for key, (was, now) in changes.items():
        if key == "clip_skip" and not _trains_text_encoders(config):
            continue
        if key in REFUSED_CHANGES:
            raise CheckpointError(
                f"resume: {key} was {json.dumps(was)} in {folder}, this run has "
                f"{json.dumps(now)}; {REFUSED_CHANGES[key]}. Set it back, or start a new run "
                "(network_weights starts a LoRA from a saved file)"
            )
    return ResumeCheck(step, progress.get("run_id"), changes)


def _trains_text_encoders(config: Config) -> bool:
    net = config.network
    return net.train_mode == "lora" and not net.network_train_unet_only


def _adapter_kind(module: object, algo: object) -> str:
    if module == "lycoris.kohya":
        return f"LyCORIS ({algo or 'lora'})"
    return "LoRA"


def _check_adapter_kind(folder: Path, changes: dict[str, tuple[object, object]]) -> None:
    """A state of one adapter kind (LoRA, LyCORIS) resumed as the other: both named, since
    the kind decides every saved weight's meaning (and their LyCORIS keys differ anyway)."""
    if "network_module" not in changes:
        return
    (was, now), algos = changes["network_module"], changes.get("algo")
    saved, this = (
        _adapter_kind(module, algos[i] if algos else None) for i, module in enumerate((was, now))
    )
    if saved.split()[0] == this.split()[0]:
        return  # the same kind under another module name: the generic refusal says it
    raise CheckpointError(
        f"resume: {folder} holds {saved} adapters (network_module = {json.dumps(was)}) and this "
        f"run trains {this} adapters (network_module = {json.dumps(now)}); a state continues "
        f"only the adapter kind it holds: set network_module = {json.dumps(was)} (with the "
        "network_args it was saved with) to continue it, or start a new run"
    )


def expected_progress(config: Config, plan: RunPlan) -> Progress:
    """The Progress this run would save at step 0: what a resumed state must match."""
    return Progress(
        global_step=0,
        seed=config.training.seed,
        train_mode=config.network.train_mode,
        steps_per_epoch=plan.steps_per_epoch,
        effective_batch_sizes=list(plan.effective_batch_sizes),
        world_size=plan.world_size,
    )


def _read_progress(folder: Path) -> dict:
    file = folder / "progress.json"
    try:
        progress = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"resume: {file} cannot be read ({exc}); the state is damaged") from None
    step = progress.get("global_step") if isinstance(progress, dict) else None
    missing = [k for k in _REQUIRED if not isinstance(progress, dict) or k not in progress]
    if type(step) is not int or step < 0 or missing:
        raise CheckpointError(
            f"resume: {file} has no valid global_step (got {json.dumps(step)}); the state is "
            "damaged: resume from an earlier state"
        )
    return progress


def _changes(folder: Path, config: Config) -> dict[str, tuple[object, object]]:
    file = folder / CONFIG_FILE
    if not file.is_file():  # states saved before settings were stored: nothing to compare
        return {}
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"resume: {file} cannot be read ({exc}); the state is damaged") from None
    now = flat_settings(config)
    keys = sorted(set(saved) | set(now), key=lambda k: (k == "datasets", k))
    return {
        k: (saved.get(k), now.get(k))
        for k in keys
        if not _same(saved.get(k), now.get(k))
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def change_lines(changes: dict[str, tuple[object, object]]) -> list[str]:
    """One line per applied change, for the plan."""
    lines = []
    for key, (was, now) in changes.items():
        if key == "datasets":
            lines.append("datasets: subset options differ from the saved run (applied)")
        elif key == STEPS_PER_EPOCH:
            lines.append(
                f"{key}: {was} -> {now} (the images changed; the run goes on from its optimizer "
                "step, in the epochs of the images there are now)"
            )
        else:
            lines.append(f"{key}: {json.dumps(was)} -> {json.dumps(now)} (applied)")
    return lines
