"""The runs the distributed tests share: each is started once per session and then reused.

A torchrun start costs ~10 s of imports per process on 2 cores, so every 2-process run serves
several assertions, and the launches a session's selected tests need (each test module lists
them in ``LAUNCHES``) start in the background, two at a time, as soon as the first test asks
for any run. Single-process runs happen in the pytest process itself, when first asked for.

- equivalence runs ``eq-<mode>-<layout>``: 2 optimizer steps of 4 images as 2x2x1 (processes
  x accumulation x batch), 1x4x1, 1x1x4 or the guard 1x2x1. The modes (MODES, each a
  tests.kits.conformance_kit.DistributedMode) are
  - every registered family's, from its kit (ConformanceKit.distributed, in
    tests/kits/<family>/kit.py; FAMILY_MODES): the config keys of every layout, the DDP-side option of the
    2-process run, the kit variant whose tiny folder (ConformanceKit.write_folder) the runs train
    on, its own captions where it needs them, whether the 2-process run is resumed, and sharded
    (FSDP2) modes. Today: SD's UNet LoRA; FLUX.1's LoRA (float8 base), full fine-tune and LoRA
    with blocks swapped to host memory; SD3.5's LoRA with text dropout and position crops;
    Z-Image's LoRA on captions of four lengths, and sharded. A family registered with a kit
    that declares a mode gets its runs here without an edit; one that declares none fails
    tests/conformance (or names why it has none in the kit's skips);
  - the suite's own (TRAINER_MODES), which check the trainer rather than a family, on the tiny
    SD 1.x model: UNet + text-encoder LoRA, full UNet, LyCORIS LoHa (with DoRA), and sharded
    LyCORIS LoKr and full UNet.
  The 2-process runs also switch on the mode's DDP-side option (gradient checkpointing,
  gradient_as_bucket_view); the single-process references run without it. Each family's first
  mode (GUARDED) is also trained as 1x2x1.
- resumed runs (RESUMED, the modes declaring ``resume``): ``<mode>-resumed`` (2 processes) and
  ``<mode>-resumed-1x4x1`` (in-process), the mode's 2x2x1 run continued from the state its own
  first step saved; "fsdp-resumed" and "fsdp-resumed-1x4x1" the same for fsdp-lora.
- schedule runs: UNet + text-encoder LoRA, 4 optimizer steps under warmup + cosine: "sync"
  (2 processes x accumulation 4, buckets counted by a DDP hook, gradients recorded), "acc1"
  (2 x 1, static graph, buckets counted), "stopped" (2 x 1, states every 2 steps, SIGINT to
  rank 1 after step 2), "resumed" (2 x 1 from the state it stopped with, through
  train_network.py), "single_acc2" and "single_acc1" (1 process).
  Runs without a hook use DDP's own C++ reduction.
- "two-nodes": the unet-lora 2x2x1 config as 2 nodes x 1 process.
- data runs ``data-2x1x1`` (torchrun) and ``data-1x2x1`` (in-process): a latent cache, flips,
  caption shuffling and a validation loss every step, as 2 processes x batch 1 and as one
  process x accumulation 2; ``fsdp-data-2x1x1`` the same sharded, sampling after every step.
- "fsdp-optimizers": each optimizer fsdp accepts, stepped on slices and whole.
- "text-fsdp": the text cache filled by sharded text encoders (fsdp_text_encoder's pieces) on
  2 processes, in memory and on disk (tests/distributed/text_sharding_fill.py).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from PIL import Image

from library.models.families import registry
from tests.distributed.runs import (
    REPO,
    TRAIN_NETWORK,
    Run,
    in_process,
    torchrun,
    torchrun_script,
    torchrun_two_nodes,
)
from tests.integration.harness import write_config
from tests.kits import KitFolders, kit_of
from tests.kits.conformance_kit import DistributedMode

# The suite's own modes: the trainer's options, on the tiny SD 1.x model (the session's
# tiny_model_dir). The families' modes come from the registry (family_modes).
TRAINER_MODES = (
    DistributedMode(name="unet+te-lora", ddp_options=("--gradient_checkpointing",),
                    holds=("lora_te_",)),
    DistributedMode(name="full-unet", keys={"train_mode": "unet", "learning_rate": 1e-4},
                    ddp_options=("--ddp_gradient_as_bucket_view",)),
    # LyCORIS adapters: LoHa with DoRA on the UNet (3x3 convs included) and the text encoder (LoKr
    # runs sharded, below).
    DistributedMode(
        name="loha-dora",
        keys={"network_module": "lycoris.kohya",
              "network_args": ["algo=loha", "dora_wd=True", "conv_dim=2", "conv_alpha=1"]},
        ddp_options=("--gradient_checkpointing",),
    ),
    # FSDP2: the 2-process runs shard the denoiser (one process has nothing to shard with, so the
    # single-process reference trains it whole). LyCORIS LoKr (Tucker cores, both Kronecker halves
    # factored, max-norm shrinking it each step) on the UNet and the text encoder, fully sharded,
    # with the text encoder under DDP beside it and a state saved every step (fsdp-resumed
    # continues it); the full UNet with the blocks kept gathered through the backward pass, an EMA
    # and gradient clipping across the shards.
    DistributedMode(
        name="fsdp-lora",
        keys={
            "network_module": "lycoris.kohya",
            "network_args": ["algo=lokr", "factor=4", "decompose_both=True", "use_tucker=True"],
            "scale_weight_norms": 1e-3,
            "fsdp": "full_shard",
            "save_every_n_steps": 1,
            "save_state": True,
        },
        ddp_options=("--gradient_checkpointing",),
        ddp_modules=("text_encoder",),
    ),
    DistributedMode(
        name="fsdp-full",
        keys={"train_mode": "unet", "learning_rate": 1e-2, "fsdp": "shard_grad_op",
              "ema_decay": 0.5, "max_grad_norm": 0.01},
    ),
)  # fmt: skip


def family_modes() -> dict[str, tuple[str, DistributedMode]]:
    """Every registered family's distributed modes (its kit's ConformanceKit.distributed), in
    registry order: mode name -> (family name, mode)."""
    modes: dict[str, tuple[str, DistributedMode]] = {}
    for entry in registry.families():
        kit = kit_of(entry.name)
        for mode in kit.distributed if kit else ():
            if mode.name in modes or mode.name in {m.name for m in TRAINER_MODES}:
                raise ValueError(f"{entry.name}'s distributed mode {mode.name!r} is taken")
            modes[mode.name] = (entry.name, mode)
    return modes


FAMILY_MODES = family_modes()
# Every mode, the families' first: name -> mode.
MODES: dict[str, DistributedMode] = {
    **{name: mode for name, (_, mode) in FAMILY_MODES.items()},
    **{mode.name: mode for mode in TRAINER_MODES},
}


def _first_modes() -> list[str]:
    first: dict[str, str] = {}
    for name, (family, _) in FAMILY_MODES.items():
        first.setdefault(family, name)
    return list(first.values())


# Each family's first mode, its own proof: also trained as 1x2x1, which must give other weights.
GUARDED = _first_modes()
# The modes whose 2-process run is continued from its step-1 state: "<mode>-resumed" (2
# processes) and "<mode>-resumed-1x4x1" (in-process).
RESUMED = [name for name, mode in MODES.items() if mode.resume]
SHARDED = [name for name, mode in MODES.items() if mode.sharded]
# Runs that are not named after the modes they train: run -> those modes.
RUN_MODES = {"two-nodes": ("unet-lora",), "fsdp-resumed": ("fsdp-lora",)}
_RESUME_SAVING = {"save_every_n_steps": 1, "save_state": True}
# layout name -> (processes, accumulation, batch)
LAYOUTS = {"2x2x1": (2, 2, 1), "1x4x1": (1, 4, 1), "1x1x4": (1, 1, 4), "1x2x1": (1, 2, 1)}
EQUIVALENCE_KEYS = {
    "max_train_steps": 2,
    # Adam's first steps are ~lr * sign(g) with the default eps, so rounding-level differences in
    # tiny gradients could flip whole updates; with eps=1e-3 the update follows the gradient and
    # the comparison checks the gradients themselves (as tests/integration does).
    "optimizer_args": ["eps=1e-3"],
    "log_with": "tensorboard",
}
# The data run: latent cache (memory: built in shares, exchanged), flips, caption shuffling and
# a validation image scored every step; 2 processes x batch 1 against 1 process x accumulation 2.
DATA_KEYS = {
    "max_train_steps": 2,
    "network_train_unet_only": True,
    "cache_latents": True,
    "flip_aug": True,
    "shuffle_caption": True,
    "caption_separator": " ",
    "validation_split": 0.25,
    "validate_every_n_steps": 1,
    "optimizer_args": ["eps=1e-3"],
    "log_with": "tensorboard",
}
# The sharded data run samples these after every step: three prompts of different step counts,
# which two processes could not split between them (each denoiser call needs both).
FSDP_PROMPTS = (
    "a red square --w 64 --h 64 --s 2 --d 1\n"
    "a blue circle --w 64 --h 64 --s 3 --d 2\n"
    "a green dot --w 64 --h 64 --s 1 --d 3\n"
)
SCHEDULE_KEYS = {
    "max_train_steps": 4,
    "lr_scheduler": "cosine",
    "lr_warmup_steps": 1,
    "learning_rate": 1e-3,
    "text_encoder_lr": 5e-4,
    "max_grad_norm": 1.0,
    "optimizer_args": ["eps=1e-3"],
    "log_with": "tensorboard",
}
# The "stopped" run saves a state every 2 steps; right after step 2, rank 1 alone gets SIGINT,
# so both processes must agree to stop at the end of step 3 and save a state there.
SAVE_EVERY, INTERRUPT_AFTER, STOPPED_AT = 2, 2, 3
_SAVING = {"save_every_n_steps": SAVE_EVERY, "save_state": True}
CONCURRENT_LAUNCHES = 2


def write_clips(folder: Path, frames: int) -> None:
    """The images of ``folder`` as videos of as many frames: each image's colours on a square
    moving across it (its own speed and way), as <name>.mp4 beside the image's caption; the
    images themselves are removed."""
    import numpy as np

    from tests.kits.videos import write_video

    for i, image in enumerate(sorted(folder.glob("*.png"))):
        with Image.open(image) as picture:
            base = np.asarray(picture.convert("RGB").resize((64, 64)))
        clip = np.repeat(base[None], frames, axis=0).copy()
        for f in range(frames):
            left = (f * (4 + 4 * i)) % 48 if i % 2 else 48 - (f * (4 + 4 * i)) % 48
            clip[f, 24:40, left : left + 16] = 255 - clip[f, 24:40, left : left + 16]
        write_video(folder / f"{image.stem}.mp4", clip, fps=16)
        image.unlink()


class Runs:
    """Starts each named run once, in the background if it is a launch, and keeps its result."""

    def __init__(self, root: Path, model_dir: Path, images: Path, kit_folders: KitFolders):
        self.root, self.model_dir, self.images = root, model_dir, images
        self.kit_folders = kit_folders  # the session's tiny kit folders (tests/conftest.py)
        self._pool = ThreadPoolExecutor(CONCURRENT_LAUNCHES, thread_name_prefix="launch")
        self._launched: dict[str, Future] = {}
        self._done: dict[str, Run] = {}
        self._model_lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- configs ----------------------------------------------------------------------------

    def config(self, name: str, images: Path | None = None, **keys) -> Path:
        out = self.root / name
        images = images or self.images
        return write_config(self.root / f"{name}.toml", self.model_dir, images, out, **keys)

    def equivalence_config(self, mode: str, layout: str) -> Path:
        _, accumulation, batch = LAYOUTS[layout]
        declared = MODES[mode]
        images = self.mode_images(mode)
        subset = (
            {"control_directory": str(self.controls(images)), "no_resize_control": True}
            if declared.references
            else {}
        )
        if declared.clips:
            subset = {"video_directory": str(images), "target_frames": [declared.clips],
                      "frame_extraction": "head"}  # fmt: skip
        return self.config(
            f"eq-{mode}-{layout}",
            images,
            subset_keys=subset,
            train_batch_size=batch,
            gradient_accumulation_steps=accumulation,
            **{
                **EQUIVALENCE_KEYS,
                **declared.keys,
                **(_RESUME_SAVING if declared.resume else {}),
                **(self._sampling_at_first(f"eq-{mode}-{layout}") if declared.samples else {}),
                "pretrained_model_name_or_path": str(self.mode_dir(mode)),
            },
        )

    def mode_dir(self, mode: str) -> Path:
        """The model folder ``mode`` trains on: its family kit's tiny folder of the mode's
        variant (written on first use), or the tiny SD model for the suite's own modes."""
        if mode not in FAMILY_MODES:
            return self.model_dir
        family, declared = FAMILY_MODES[mode]
        return self.kit_folders(family, declared.variant)

    def mode_images(self, mode: str) -> Path:
        """The images ``mode`` trains on: the shared ones, with the mode's own captions where it
        declares them (written on first use)."""
        declared = MODES[mode]
        if not declared.captions and not declared.references and not declared.clips:
            return self.images

        def write(folder: Path) -> None:
            folder.mkdir()
            for file in sorted(self.images.iterdir()):
                if file.suffix in (".png", ".txt"):
                    shutil.copy(file, folder / file.name)
            images = sorted(folder.glob("*.png"))
            if declared.captions:
                for image, caption in zip(images, declared.captions, strict=True):
                    image.with_suffix(".txt").write_text(caption, encoding="utf-8")
            if declared.references:
                # each image mirrored, every other one 32 pixels wider: kept at their own sizes
                # (no_resize_control), the references make two groups of micro-batches
                self.controls(folder).mkdir()
                for i, image in enumerate(images):
                    with Image.open(image) as picture:
                        mirrored = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                        size = (picture.width + 32 * (i % 2), picture.height)
                        mirrored.resize(size).save(self.controls(folder) / image.name)
            if declared.clips:
                write_clips(folder, declared.clips)

        return self._tiny_folder(f"imgs-{mode}", write)

    @staticmethod
    def controls(images: Path) -> Path:
        """The control folder of a mode's images (its reference images, by the same names)."""
        return images.parent / f"{images.name}-controls"

    def mode_state(self, mode: str) -> Path:
        """The state the 2x2x1 run of ``mode`` (a resume mode) saved after its first step."""
        self.get(f"eq-{mode}-2x2x1")
        return self.root / f"eq-{mode}-2x2x1" / "run-step00000001-state"

    def _tiny_folder(self, name: str, write) -> Path:
        folder = self.root / name
        with self._model_lock:  # written by start() first; the lock only guards a late first ask
            if not folder.is_dir():
                write(folder)
        return folder

    def data_config(self, name: str, accumulation: int, **keys) -> Path:
        return self.config(name, gradient_accumulation_steps=accumulation, **DATA_KEYS, **keys)

    def fsdp_data_config(self) -> Path:
        """The data run's settings, sharded, sampling FSDP_PROMPTS after every step."""
        return self.data_config(
            "fsdp-data-2x1x1", 1, fsdp="full_shard", sample_prompts=str(self._prompts("fsdp")),
            sample_every_n_steps=1,
        )  # fmt: skip

    def _prompts(self, run: str) -> Path:
        """FSDP_PROMPTS' file for ``run`` (one per run: runs start side by side)."""
        prompts = self.root / f"{run}-prompts.txt"
        prompts.write_text(FSDP_PROMPTS, encoding="utf-8")
        return prompts

    def _sampling_at_first(self, run: str) -> dict:
        """``run``'s keys drawing FSDP_PROMPTS before the first step (DistributedMode.samples)."""
        return {"sample_prompts": str(self._prompts(run)), "sample_at_first": True}

    def schedule_config(self, accumulation: int, **keys) -> Path:
        name = f"sched-acc{accumulation}" + "".join(f"-{k}" for k in sorted(keys))
        return self.config(name, gradient_accumulation_steps=accumulation, **SCHEDULE_KEYS, **keys)

    def stopped_state(self, step: int = STOPPED_AT) -> Path:
        """The "stopped" run's state of optimizer step ``step``."""
        self.get("stopped")
        return self.root / "stopped" / f"run-step{step:08d}-state"

    def fsdp_state(self, layout: str = "2x2x1") -> Path:
        """The state the fsdp-lora run of ``layout`` saved after its first optimizer step."""
        self.get(f"eq-fsdp-lora-{layout}")
        return self.root / f"eq-fsdp-lora-{layout}" / "run-step00000001-state"

    # -- the runs ---------------------------------------------------------------------------

    def _launches(self) -> dict[str, Callable[[], Run | tuple[Run, Run]]]:
        """Runs that start torchrun: name -> how to start it (blocking until it ends)."""
        out = self.root.joinpath
        launches = {
            f"eq-{mode}-2x2x1": (
                lambda mode=mode: torchrun(
                    self.equivalence_config(mode, "2x2x1"),
                    *MODES[mode].ddp_options,
                    out=out(f"eq-{mode}-2x2x1"),
                )
            )
            for mode in MODES
        }
        # the resume modes' 2x2x1 runs continued from the state their own first step saved
        launches |= {
            f"{mode}-resumed": (
                lambda mode=mode: torchrun(
                    self.equivalence_config(mode, "2x2x1"),
                    *MODES[mode].ddp_options,
                    "--resume",
                    str(self.mode_state(mode)),
                    out=out(f"{mode}-resumed"),
                )
            )
            for mode in RESUMED
        }
        static = "--ddp_static_graph"
        launches |= {
            "sync": lambda: torchrun(
                self.schedule_config(4), out=out("sync"), hook=True, grads=True
            ),
            "acc1": lambda: torchrun(self.schedule_config(1), static, out=out("acc1"), hook=True),
            "stopped": lambda: torchrun(
                self.schedule_config(1, **_SAVING),
                static,
                out=out("stopped"),
                interrupt=(INTERRUPT_AFTER, 1),
            ),
            "resumed": lambda: torchrun(
                self.schedule_config(1, **_SAVING),
                static,
                "--resume",
                str(self.stopped_state()),
                out=out("resumed"),
                script=TRAIN_NETWORK,  # the user's entry point itself, no probe
            ),
            "data-2x1x1": lambda: torchrun(
                self.data_config("data-2x1x1", 1), out=out("data-2x1x1")
            ),
            "fsdp-data-2x1x1": lambda: torchrun(
                self.fsdp_data_config(), out=out("fsdp-data-2x1x1")
            ),
            # the FSDP LoRA run continued from the state its own first step saved (gathered
            # whole), so a resume cuts every saved tensor back into each process's slice
            "fsdp-resumed": lambda: torchrun(
                self.equivalence_config("fsdp-lora", "2x2x1"),
                *MODES["fsdp-lora"].ddp_options,
                "--resume",
                str(self.fsdp_state()),
                out=out("fsdp-resumed"),
            ),
            "fsdp-optimizers": lambda: torchrun_script(
                REPO / "tests" / "distributed" / "fsdp_optimizers.py",
                str(out("fsdp-optimizers.json")),
                out=out("fsdp-optimizers"),
            ),
            "text-fsdp": lambda: torchrun_script(
                REPO / "tests" / "distributed" / "text_sharding_fill.py",
                str(out("text-fsdp")),
                out=out("text-fsdp-log"),
            ),
            "two-nodes": lambda: torchrun_two_nodes(
                self.equivalence_config("unet-lora", "2x2x1"), out=out("two-nodes")
            ),
        }
        return launches

    def _in_process(self, name: str) -> Run:
        out = self.root / name
        if name.startswith("eq-"):
            mode, layout = name[3:].rsplit("-", 1)
            return in_process(self.equivalence_config(mode, layout), out=out)
        if name == "data-1x2x1":
            return in_process(self.data_config(name, 2), out=out)
        if name == "fsdp-resumed-1x4x1":  # one process continues what two sharded ones saved
            config = self.equivalence_config("fsdp-lora", "1x4x1")
            return in_process(config, "--resume", str(self.fsdp_state()), out=out)
        mode = name.removesuffix("-resumed-1x4x1")
        if mode in RESUMED:  # one process continues what two saved
            config = self.equivalence_config(mode, "1x4x1")
            return in_process(config, "--resume", str(self.mode_state(mode)), out=out)
        accumulation = {"single_acc2": 2, "single_acc1": 1}[name]
        return in_process(self.schedule_config(accumulation), out=out)

    def start(self, names: list[str]) -> None:
        """Queue the launches among ``names`` (in order) without waiting for them."""
        for mode in MODES:
            if any(mode in RUN_MODES.get(name, ()) or f"-{mode}-" in f"-{name}-" for name in names):
                # Written here, in the test thread, before any launch thread starts: building a
                # tiny model seeds torch's process-wide generator, which an in-process run in
                # this thread may be drawing from at the same moment.
                self.mode_dir(mode)
                self.mode_images(mode)
        launches = self._launches()
        for name in names:
            if name in launches and name not in self._launched:
                self._launched[name] = self._pool.submit(launches[name])

    def get(self, name: str):
        """The finished run ``name`` (for "two-nodes": one Run per node)."""
        if name not in self._done:
            self.start([name])
            if name in self._launched:
                self._done[name] = self._launched[name].result()
            else:
                self._done[name] = self._in_process(name)
        return self._done[name]

    def equivalence(self, mode: str, layout: str) -> Run:
        return self.get(f"eq-{mode}-{layout}").check()

    def schedule(self, name: str) -> Run:
        run = self.get(name)
        return run if name == "stopped" else run.check()

    def two_nodes(self) -> tuple[Run, Run]:
        return self.get("two-nodes")
