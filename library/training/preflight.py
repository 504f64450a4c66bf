"""Checks made before any model loads: the files a run starts from, where it writes (never over
them), who owns the output name, and what a resume may change. Everything here fails fast with
one line."""

from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from library.config.provenance import provenance
from library.config.schema import Config
from library.errors import CheckpointError, ConfigError, DifftuneError
from library.models.families.registry import component_file_keys
from library.sampling.grid import is_sample_image, sample_dir
from library.saving.input_clash import OUTPUT_INSIDE, SAME, Clash, clash
from library.saving.output_names import EPOCH, STEP
from library.saving.outputs import OutputLayout
from library.saving.run_lock import RunLock
from library.training.from_main import from_main
from library.training.plan import RunPlan
from library.training.resume_rules import ResumeCheck, check_resume


@dataclass
class RunStart:
    """What the checks established: the run's id, its lock (None for a dry run or on processes
    other than the main one) and, for a resume, what the state says."""

    run_id: str
    lock: RunLock | None
    resume: ResumeCheck | None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def check_launch_layout(num_processes: int, distributed_type: object = None) -> None:
    """A launcher that started several processes got a process group: without one, each
    process would train alone and they would fight over the output name. An accelerate
    config that asks accelerate itself to shard (FSDP, DeepSpeed) is refused: difftune wraps
    the models itself, and sharding is its own fsdp key."""
    kind = getattr(distributed_type, "value", distributed_type)
    if kind in ("FSDP", "DEEPSPEED"):
        raise ConfigError(
            f"accelerate is configured for {kind} (accelerate config or launch flags); difftune "
            'shards the denoiser itself: launch with plain multi-GPU and set fsdp = "full_shard" '
            'or "shard_grad_op" in the config (docs/distributed.md)'
        )
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and num_processes == 1:
        raise ConfigError(
            f"the launcher started {launched} processes, but accelerate set each up as a single "
            "process (no GPU was found); on a machine without GPUs set ACCELERATE_USE_CPU=true "
            "in the launch's environment (docs/distributed.md)"
        )


def check_input_files(config: Config) -> None:
    """The state folder and LoRA file a run starts from exist and are what they should be."""
    resume, weights = config.saving.resume, config.network.network_weights
    if resume:
        path = Path(resume)
        if path.is_file():
            raise CheckpointError(
                f"resume: {resume} is a file; give the *-state folder saved beside it by save_state"
            )
        if not path.is_dir():
            raise CheckpointError(f"resume: {resume} does not exist; give a *-state folder saved by save_state")
        if not (path / "progress.json").is_file():
            raise CheckpointError(
                f"resume: {resume} is a folder but not a saved state (no progress.json); give a "
                "*-state folder saved by save_state"
            )
    if weights:
        path = Path(weights)
        if path.is_dir():
            raise CheckpointError(
                f"network_weights: {weights} is a folder; give the LoRA's .safetensors file"
            )
        if not path.is_file():
            raise CheckpointError(
                f"network_weights: {weights} does not exist; give a kohya-format LoRA .safetensors file"
            )


def check_output_dir(config: Config) -> None:
    """output_dir is (or can become) a writable folder; checked by writing a probe file."""
    folder = Path(config.saving.output_dir)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"output_dir {folder} is a file, not a folder; choose another output_dir")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".difftune-write-check.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"output_dir {folder} is not writable ({reason}); choose another output_dir") from None


def run_inputs(config: Config) -> list[tuple[str, str]]:
    """(key, path) of every file and folder the run reads, as the config gives them."""
    model, flow, data = config.model, config.flow, config.data
    named = [
        ("pretrained_model_name_or_path", model.pretrained_model_name_or_path),
        ("vae", model.vae),
        ("tokenizer_path", model.tokenizer_path),
        ("tokenizer_cache_dir", model.tokenizer_cache_dir),
        *((key, getattr(flow, key)) for key in component_file_keys()),
        ("network_weights", config.network.network_weights),
        ("resume", config.saving.resume),
        ("train_data_dir", data.train_data_dir),
        ("reg_data_dir", data.reg_data_dir),
        ("in_json", data.in_json),
        ("dataset_config", data.dataset_config),
        ("sample_prompts", config.sampling.sample_prompts),
    ]
    for i, dataset in enumerate(config.datasets):
        for j, subset in enumerate(dataset.subsets):
            key = f"datasets[{i}].subsets[{j}]"
            for source in ("image_dir", "metadata_file", "video_directory", "video_jsonl_file"):
                named += [(f"{key}.{source}", getattr(subset, source))]
    named += [("config file", file) for file in provenance(config).files]
    return [(key, path) for key, path in named if path]


def check_inputs_untouched(config: Config, plan: RunPlan, resume: ResumeCheck | None) -> None:
    """ConfigError when a path the run may write (an output of its name, its summary, its lock,
    their temporaries, its sample images) is an input of the run, lies inside an input folder or
    holds an input; --overwrite changes nothing here (the earlier sample images it moves aside
    count as written). The resume state is the one output of the run that may be
    an input: the run continues it and never writes at its path (see _writes_resume_state)."""
    layout = OutputLayout(config.saving)
    kept = _resume_entry(config, layout)
    if kept is not None and _writes_resume_state(config, plan, resume, kept):
        kept = None

    def writes(entry: str) -> bool:
        return entry != kept and layout.writes(entry)

    def samples(entry: str) -> bool:
        return is_sample_image(layout.name, entry)

    # (folder, the entries of it the run writes or moves, what the folder and such an entry are)
    places = [(layout.dir, writes, ("output_dir", "an output"))]
    if config.sampling.sample_prompts or (config.saving.overwrite and resume is None):
        places.append((sample_dir(layout.dir), samples, ("the sample folder", "a sample image")))
    for key, path in run_inputs(config):
        for folder, owned, words in places:
            found = clash(folder, path, owned)
            if found is not None:
                why = "this run would save its own state there, and " if key == "resume" else ""
                raise ConfigError(
                    f"{_clash_text(found, folder, layout.name, words, key, path)}; choose another "
                    f"output_dir or output_name ({why}a run never writes over its inputs)"
                )


def _clash_text(
    found: Clash, folder: Path, name: str, words: tuple[str, str], key: str, path: str
) -> str:
    if found.relation == OUTPUT_INSIDE:
        return f"{words[0]} {folder} lies inside {key} {path}"
    output, what = folder / found.output.name, f'{words[1]} of output_name "{name}"'
    if found.relation == SAME:
        return f"{key} {path} is {output}, {what}"
    return f"{output}, {what}, {found.relation} {key} {path}"


def _resume_entry(config: Config, layout: OutputLayout) -> str | None:
    """The name of the resume state in output_dir when it is one of this name's outputs."""
    if not config.saving.resume:
        return None
    state = Path(os.path.realpath(config.saving.resume))
    if state.parent != Path(os.path.realpath(layout.dir)) or not layout.writes(state.name):
        return None
    return state.name


def _writes_resume_state(
    config: Config, plan: RunPlan, resume: ResumeCheck | None, entry: str
) -> bool:
    """Whether this run writes a state at the resume state's own name: the final state when it
    saves one at the end, a numbered state on its save cadence after the step resumed at. (A
    stop right at the resumed step keeps the existing state of that step; save_last_n_steps
    prunes the resumed state with the run's other old saves, as kohya does.)"""
    layout, saving = OutputLayout(config.saving), config.saving
    rest = entry[len(layout.name) :]
    if rest == "-state":
        return bool(saving.save_state or saving.save_state_on_train_end)
    step = resume.global_step if resume is not None else 0
    numbered = STEP.fullmatch(rest) or EPOCH.fullmatch(rest)
    if numbered is None or numbered.group(2) != "-state":
        return True  # weights, a diffusers folder: written whole at the end
    if not saving.save_state:
        return False
    number = int(numbered.group(1))
    if numbered.re is STEP:
        return layout.step_due(number, plan.total_steps) and number > step
    return layout.epoch_due(number, plan.epochs) and number * plan.steps_per_epoch > step


def start_run(config: Config, plan: RunPlan, accelerator, dry_run: bool) -> RunStart:
    """Run every check before models load and, unless ``dry_run``, take the output name's lock.

    Called on every process; the main process owns the lock and the output folder, and its
    outcome (an error or the run id) is shared with the others, so all of them stop together.
    """
    check_input_files(config)
    resume = None
    if config.saving.resume:
        resume = check_resume(Path(config.saving.resume), config, plan)
    check_inputs_untouched(config, plan, resume)
    lock, outcome = None, None
    if accelerator.is_main_process:
        try:
            lock, run_id = _claim_outputs(config, resume, dry_run)
            outcome = ("ok", run_id)
        except DifftuneError as exc:
            outcome = (type(exc).__name__, str(exc))
    outcome = from_main(accelerator, outcome)
    if outcome[0] != "ok":
        raise (CheckpointError if outcome[0] == "CheckpointError" else ConfigError)(outcome[1])
    return RunStart(outcome[1], lock, resume)


def _claim_outputs(config: Config, resume: ResumeCheck | None, dry_run: bool) -> tuple[RunLock | None, str]:
    layout = OutputLayout(config.saving)
    run_id = (resume.run_id if resume else None) or _new_run_id()
    if dry_run:  # a dry run writes nothing: it only reports what a real run would refuse
        layout.refuse_overwrite(resuming=resume is not None, run_id=resume.run_id if resume else None)
        return None, run_id
    check_output_dir(config)
    lock = RunLock(config.saving.output_dir, config.saving.output_name).acquire()
    try:
        layout.remove_leftovers()  # ours alone: we hold the name's lock
        layout.refuse_overwrite(resuming=resume is not None, run_id=resume.run_id if resume else None)
        if config.saving.overwrite and resume is None:
            _set_aside(layout)
    except BaseException:
        lock.release()
        raise
    return lock, run_id


def _set_aside(layout: OutputLayout) -> None:
    """--overwrite: the earlier run's files of this name move to a folder of their own."""
    try:
        folder = layout.set_aside()
    except OSError as exc:
        raise ConfigError(
            f'--overwrite: cannot move the earlier outputs of output_name "{layout.name}" '
            f"aside in {layout.dir} ({exc.strerror or exc}); move or delete them yourself"
        ) from None
    if folder is not None:
        print(f"--overwrite: the earlier run's files of this name moved to {folder}", flush=True)


def _new_run_id() -> str:
    # kohya's ss_session_id is a random number written as decimal; ours is one too
    return str(secrets.randbits(63))
