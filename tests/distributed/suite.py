"""The runs the distributed tests share: each is started once per session and then reused.

A torchrun start costs ~10 s of imports per process on 2 cores, so every 2-process run serves
several assertions, and the launches a session's selected tests need (each test module lists
them in ``LAUNCHES``) start in the background, two at a time, as soon as the first test asks
for any run. Single-process runs happen in the pytest process itself, when first asked for.

- equivalence runs ``eq-<mode>-<layout>``: 2 optimizer steps of 4 images as 2x2x1 (processes
  x accumulation x batch), 1x4x1, 1x1x4 or the guard 1x2x1, for UNet LoRA, UNet + text-encoder
  LoRA, full UNet, LyCORIS LoHa (with DoRA), Flux.1 LoRA and full fine-tune (on a tiny Flux
  folder), Z-Image LoRA (on a tiny Z-Image folder, captions of four lengths), and FSDP2-sharded
  LyCORIS LoKr, full UNet and Z-Image LoRA. The 2-process runs also switch on a DDP-side option
  per mode (gradient checkpointing, gradient_as_bucket_view); the single-process references run
  without it.
- schedule runs: UNet + text-encoder LoRA, 4 optimizer steps under warmup + cosine: "sync"
  (2 processes x accumulation 4, buckets counted by a DDP hook, gradients recorded), "acc1"
  (2 x 1, static graph, buckets counted), "stopped" (2 x 1, states every 2 steps, SIGINT to
  rank 1 after step 2), "resumed" (2 x 1 from the state it stopped with, through train_network.py), "single_acc2" and "single_acc1" (1 process).
  Runs without a hook use DDP's own C++ reduction.
- "two-nodes": the unet-lora 2x2x1 config as 2 nodes x 1 process.
- "zimage-lora-resumed" (2 processes) and "zimage-lora-resumed-1x4x1" (in-process): the
  zimage-lora 2x2x1 run continued from the state its own first step saved.
- data runs ``data-2x1x1`` (torchrun) and ``data-1x2x1`` (in-process): a latent cache, flips,
  caption shuffling and a validation loss every step, as 2 processes x batch 1 and as one
  process x accumulation 2.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

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

# mode -> (keys of every layout, command-line keys of the 2-process run only)
MODES: dict[str, tuple[dict, list[str]]] = {
    "unet-lora": ({"network_train_unet_only": True}, []),
    "unet+te-lora": ({}, ["--gradient_checkpointing"]),
    "full-unet": ({"train_mode": "unet", "learning_rate": 1e-4}, ["--ddp_gradient_as_bucket_view"]),
    # Flux.1 LoRA (transformer, CLIP-L and T5) on the tiny Flux folder (Runs.flux_dir), with its
    # frozen weights in float8 (fp8_base): DDP must leave them out of its start-up broadcast.
    "flux-lora": (
        {
            "network_module": "networks.lora_flux",
            "network_args": ["train_t5xxl=True"],
            "fp8_base": True,
            "timestep_sampling": "shift",
            "model_prediction_type": "raw",
            "guidance_scale": 1.0,
            "bucket_reso_steps": 16,
        },
        ["--gradient_checkpointing"],
    ),
}
MODES["flux-full"] = (
    {**MODES["flux-lora"][0], "train_mode": "unet", "learning_rate": 1e-3, "network_args": [],
     "fp8_base": False},
    ["--ddp_gradient_as_bucket_view"],
)
# SD3.5 Medium LoRA on the MMDiT, CLIP-L and CLIP-G (flux-lora covers T5 adapters), with kohya's
# SD3 timestep density and every text encoder's dropout and the random position crops at 0.5:
# each sample's draws must follow the sample, not its rank or micro-batch.
MODES["sd3-lora"] = (
    {
        "network_module": "networks.lora_sd3",
        "weighting_scheme": "logit_normal",
        "training_shift": 3.0,
        "clip_l_dropout_rate": 0.5,
        "clip_g_dropout_rate": 0.5,
        "t5_dropout_rate": 0.5,
        "pos_emb_random_crop_rate": 0.5,
        "bucket_reso_steps": 16,
    },
    ["--gradient_checkpointing"],
)
# LyCORIS adapters: LoHa with DoRA on the UNet (3x3 convs included) and the text encoder (LoKr
# runs sharded, below).
MODES["loha-dora"] = (
    {
        "network_module": "lycoris.kohya",
        "network_args": ["algo=loha", "dora_wd=True", "conv_dim=2", "conv_alpha=1"],
    },
    ["--gradient_checkpointing"],
)
# flux-lora with its last double block and both single blocks swapped to host memory
# (blocks_to_swap, over float8 weights): DDP must neither broadcast nor sync the host weights.
MODES["flux-swap"] = ({**MODES["flux-lora"][0], "blocks_to_swap": 2}, ["--gradient_checkpointing"])
# FSDP2: the 2-process runs shard the denoiser (one process has nothing to shard with, so the
# single-process reference trains it whole). LyCORIS LoKr (Tucker cores, both Kronecker halves
# factored, max-norm shrinking it each step) on the UNet and the text encoder, fully sharded,
# with the text encoder under DDP beside it and a state saved every step; the full UNet with the
# blocks kept gathered through the backward pass, an EMA and gradient clipping across the shards.
MODES["fsdp-lora"] = (
    {
        "network_module": "lycoris.kohya",
        "network_args": ["algo=lokr", "factor=4", "decompose_both=True", "use_tucker=True"],
        "scale_weight_norms": 1e-3,
        "fsdp": "full_shard",
        "save_every_n_steps": 1,
        "save_state": True,
    },
    ["--gradient_checkpointing"],
)
# Z-Image LoRA (musubi-tuner's targets) on the tiny Z-Image folder (Runs.zimage_dir), on images
# whose captions have four lengths (Runs.zimage_images): alone in a micro-batch each caption is
# its own length, in the batch of 4 it is padded to the longest (TextConditioning.lengths cut
# it back); both must train the same LoRA. A state every step: zimage-lora-resumed continues it.
MODES["zimage-lora"] = (
    {
        "network_module": "networks.lora_zimage",
        "network_train_unet_only": True,
        "bucket_reso_steps": 16,
        "save_every_n_steps": 1,
        "save_state": True,
    },
    ["--gradient_checkpointing"],
)
# The same run with the transformer sharded (FSDP2: each block and the rest, the pad tokens
# among it, split over the processes).
MODES["zimage-fsdp"] = (
    {k: v for k, v in MODES["zimage-lora"][0].items() if not k.startswith("save_")}
    | {"fsdp": "full_shard"},
    [],
)
MODES["fsdp-full"] = (
    {**MODES["full-unet"][0], "learning_rate": 1e-2, "fsdp": "shard_grad_op", "ema_decay": 0.5,
     "max_grad_norm": 0.01},  # fmt: skip
    [],
)
# Modes trained on another model than the tiny SD one: mode -> the Runs method giving its folder.
MODE_MODELS = {"flux-lora": "flux_dir", "flux-full": "flux_dir", "sd3-lora": "sd3_dir",
               "flux-swap": "flux_dir", "zimage-lora": "zimage_dir",
               "zimage-fsdp": "zimage_dir"}  # fmt: skip
# Modes trained on other images than the shared ones: mode -> the Runs method giving the folder.
MODE_IMAGES = {"zimage-lora": "zimage_images", "zimage-fsdp": "zimage_images"}
# Z-Image's captions (Runs.zimage_images), one per image: 21, 42, 73 and 151 tokens with Qwen3's
# chat template, so the transformer pads them to 32, 64, 96 and 160.
ZIMAGE_CAPTIONS = (
    "red",
    "a photo of shape number 1",
    "a photo of shape number 2 on a gradient, centred in the frame",
    "a much longer caption of shape number three, a coloured square on a soft gradient of warm "
    "and cool tones, photographed from above in even daylight",
)
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


class Runs:
    """Starts each named run once, in the background if it is a launch, and keeps its result."""

    def __init__(self, root: Path, model_dir: Path, images: Path):
        self.root, self.model_dir, self.images = root, model_dir, images
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
        model = {}
        if mode in MODE_MODELS:
            model["pretrained_model_name_or_path"] = str(getattr(self, MODE_MODELS[mode])())
        images = getattr(self, MODE_IMAGES[mode])() if mode in MODE_IMAGES else None
        return self.config(
            f"eq-{mode}-{layout}",
            images,
            train_batch_size=batch,
            gradient_accumulation_steps=accumulation,
            **EQUIVALENCE_KEYS,
            **MODES[mode][0],
            **model,
        )

    def flux_dir(self) -> Path:
        """A tiny Flux.1 dev folder, written on first use."""
        from library.models.families.flux.tiny_files import write_tiny_flux_folder

        return self._tiny_folder("tiny-flux", lambda folder: write_tiny_flux_folder(folder, "dev"))

    def sd3_dir(self) -> Path:
        """A tiny SD3.5 Medium folder, written on first use."""
        from library.models.families.sd3.tiny_files import write_tiny_sd3_folder

        return self._tiny_folder(
            "tiny-sd3", lambda folder: write_tiny_sd3_folder(folder, "sd3.5-medium")
        )

    def zimage_dir(self) -> Path:
        """A tiny Z-Image-Turbo folder, written on first use."""
        from library.models.families.zimage.tiny import write_tiny_zimage_folder

        return self._tiny_folder(
            "tiny-zimage", lambda folder: write_tiny_zimage_folder(folder, "turbo")
        )

    def zimage_images(self) -> Path:
        """The shared images with ZIMAGE_CAPTIONS (four lengths), written on first use."""

        def write(folder: Path) -> None:
            folder.mkdir()
            for image in sorted(self.images.glob("*.png")):
                shutil.copy(image, folder / image.name)
            for image, caption in zip(sorted(folder.glob("*.png")), ZIMAGE_CAPTIONS, strict=True):
                image.with_suffix(".txt").write_text(caption, encoding="utf-8")

        return self._tiny_folder("zimage-imgs", write)

    def zimage_state(self) -> Path:
        """The state the zimage-lora 2x2x1 run saved after its first optimizer step."""
        self.get("eq-zimage-lora-2x2x1")
        return self.root / "eq-zimage-lora-2x2x1" / "run-step00000001-state"

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
        prompts = self.root / "fsdp-prompts.txt"
        prompts.write_text(FSDP_PROMPTS, encoding="utf-8")
        return self.data_config(
            "fsdp-data-2x1x1", 1, fsdp="full_shard", sample_prompts=str(prompts),
            sample_every_n_steps=1,
        )  # fmt: skip

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
                    *MODES[mode][1],
                    out=out(f"eq-{mode}-2x2x1"),
                )
            )
            for mode in MODES
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
                *MODES["fsdp-lora"][1],
                "--resume",
                str(self.fsdp_state()),
                out=out("fsdp-resumed"),
            ),
            "fsdp-optimizers": lambda: torchrun_script(
                REPO / "tests" / "distributed" / "fsdp_optimizers.py",
                str(out("fsdp-optimizers.json")),
                out=out("fsdp-optimizers"),
            ),
            # the Z-Image LoRA run continued from the state its own first step saved
            "zimage-lora-resumed": lambda: torchrun(
                self.equivalence_config("zimage-lora", "2x2x1"),
                *MODES["zimage-lora"][1],
                "--resume",
                str(self.zimage_state()),
                out=out("zimage-lora-resumed"),
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
        if name == "zimage-lora-resumed-1x4x1":  # one process continues what two saved
            config = self.equivalence_config("zimage-lora", "1x4x1")
            return in_process(config, "--resume", str(self.zimage_state()), out=out)
        accumulation = {"single_acc2": 2, "single_acc1": 1}[name]
        return in_process(self.schedule_config(accumulation), out=out)

    def start(self, names: list[str]) -> None:
        """Queue the launches among ``names`` (in order) without waiting for them."""
        for table in (MODE_MODELS, MODE_IMAGES):
            for mode, folder in table.items():
                if any(mode in name for name in names):
                    # Written here, in the test thread, before any launch thread starts:
                    # building a tiny model seeds torch's process-wide generator, which an
                    # in-process run in this thread may be drawing from at the same moment.
                    getattr(self, folder)()
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
