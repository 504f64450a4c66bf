"""Training speed, memory and scaling: seconds per optimizer step, images/s, time to the first
step and peak memory of short real trainings, for built-in cases or your own config.

    python bench/train_speed.py                                  # the tiny cases, 1 process
    python bench/train_speed.py --cases sd15-lora sd15-lora-cached --steps 12
    python bench/train_speed.py --cases tiny-sd1-lora --processes 1 2    # scaling efficiency
    python bench/train_speed.py --config my.toml --steps 20              # your own run
    python bench/train_speed.py --cases sd15-lora --sd_scripts ~/sd-scripts   # against kohya

Not a test and not timed in CI. Every run is ``train_network.py`` itself, started as a user
starts it (``python train_network.py`` for one process, ``torchrun`` for several), so the
figures include data loading, caching and saving exactly as a real run does. Each process is
timed by bench/step_timer/sitecustomize.py, a global post-step hook on every torch optimizer that
records the wall clock after each optimizer step; with ``--sd_scripts`` kohya's trainer is timed
by the same hook on the same config file, images and model, alternately with difftune.

Figures, per run:
- s/step: the median time between optimizer steps after the first ``--warmup`` steps (which
  include one-off work: allocation, kernel selection); the mean beside it;
- images/s: samples per optimizer step (batch x accumulation x processes) over s/step;
- first step: seconds from starting the command to the end of the first optimizer step
  (model loading, caching, the first forward and backward);
- peak memory: the largest resident set (RSS) of any training process; on CUDA also the most
  memory PyTorch allocated;
- with several ``--processes``: scaling efficiency, (images/s with N) / (N x images/s with 1).

Human-readable lines go to stderr and one JSON object per run to stdout, so
``python bench/train_speed.py > results.jsonl`` keeps the figures.

Cases: ``tiny-*`` use the tiny random models the tests use (seconds per run; for comparing
changes, not for absolute figures). ``sd15-*`` use a full-size SD 1.5 (random weights at the released
shapes, bench/random_models.py), written once to ``--model_cache`` (about 2 GB). Weights' values do not change the cost of a step. Images are smooth synthetic
JPEGs, made once per size. On CPU each process gets ``cores / processes`` threads unless
OMP_NUM_THREADS is set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

from bench.random_models import UnknownModel, model_folder  # noqa: E402

TIMER_DIR = REPO / "bench" / "step_timer"
# sd-scripts looks for CLIP's tokenizer under this name inside tokenizer_cache_dir
KOHYA_TOKENIZER_NAME = "openai_clip-vit-large-patch14"


@dataclass(frozen=True)
class Case:
    """One benchmark case: a model, an image size and the config keys that differ."""

    model: str  # "tiny-sd1", "tiny-sdxl", "tiny-flux", "tiny-sd3", "sd15"
    resolution: int
    keys: dict = field(default_factory=dict)
    kohya: bool = False  # sd-scripts' train_network.py runs it too (--sd_scripts)
    about: str = ""


LORA = {"network_module": "networks.lora", "network_dim": 8, "network_alpha": 8}
FLOW_LORA = {"network_dim": 8, "network_alpha": 8, "network_train_unet_only": True}
CASES = {
    "tiny-sd1-lora": Case("tiny-sd1", 64, LORA, about="tiny SD 1.x, UNet + text-encoder LoRA"),
    "tiny-sd1-full-unet": Case(
        "tiny-sd1",
        64,
        {"train_mode": "unet", "learning_rate": 1e-5},
        about="tiny SD 1.x, whole UNet",
    ),  # fmt: skip
    "tiny-sdxl-lora": Case("tiny-sdxl", 64, LORA, about="tiny SDXL, UNet + text-encoder LoRA"),
    "tiny-flux-lora": Case(
        "tiny-flux",
        64,
        {
            **FLOW_LORA,
            "network_module": "networks.lora_flux",
            "timestep_sampling": "shift",
            "model_prediction_type": "raw",
            "guidance_scale": 1.0,
            "bucket_reso_steps": 16,
        },  # fmt: skip
        about="tiny FLUX.1 [dev], transformer LoRA",
    ),
    "tiny-sd3-lora": Case(
        "tiny-sd3",
        64,
        {
            **FLOW_LORA,
            "network_module": "networks.lora_sd3",
            "weighting_scheme": "logit_normal",
            "bucket_reso_steps": 16,
        },  # fmt: skip
        about="tiny SD3.5 Medium, MMDiT LoRA",
    ),
    "sd15-lora": Case(
        "sd15", 128, LORA, kohya=True, about="SD 1.5, UNet + text-encoder LoRA, 128 px"
    ),  # fmt: skip
    "sd15-lora-cached": Case(
        "sd15",
        128,
        {**LORA, "cache_latents": True, "network_train_unet_only": True},
        kohya=True,
        about="SD 1.5, UNet LoRA on cached latents, 128 px",
    ),
    "sd15-lora-256": Case(
        "sd15", 256, LORA, kohya=True, about="SD 1.5, UNet + text-encoder LoRA, 256 px"
    ),  # fmt: skip
    "sd15-lora-cached-bf16": Case(
        "sd15",
        128,
        {
            **LORA,
            "cache_latents": True,
            "network_train_unet_only": True,
            "mixed_precision": "bf16",
        },  # fmt: skip
        kohya=True,
        about="SD 1.5, UNet LoRA on cached latents, 128 px, bf16 mixed precision",
    ),
    "sd15-full-unet": Case(
        "sd15",
        128,
        {"train_mode": "unet", "learning_rate": 1e-5},
        about="SD 1.5, whole UNet, 128 px",
    ),  # fmt: skip
}
DEFAULT_CASES = [name for name in CASES if name.startswith("tiny-")]

# Keys every case shares; both trainers read them (kohya's flat args-file words).
COMMON_KEYS = {
    "optimizer_type": "AdamW",
    "learning_rate": 1e-4,
    "train_batch_size": 1,
    "mixed_precision": "no",
    "seed": 0,
    "sdpa": True,
    "save_model_as": "safetensors",
    "max_data_loader_n_workers": 0,
    "caption_extension": ".txt",
    "output_name": "bench",
}


class BenchError(Exception):
    """A run of the benchmark failed; the message says which and why."""


# --- inputs -----------------------------------------------------------------------------------


def image_folder(resolution: int, cache: Path, count: int = 8) -> Path:
    """A kohya DreamBooth folder (``1_bench``, no captions) of ``count`` square JPEGs of
    exactly ``resolution`` (smooth noise): every trainer takes them without bucketing or
    cropping, and every step has the same shape."""
    import numpy as np
    from PIL import Image

    root = cache / f"square-images-{resolution}"
    if not (root / "1_bench").is_dir():
        tmp = cache / f".square-images-{resolution}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "1_bench").mkdir(parents=True)
        rng = np.random.default_rng(0)
        for i in range(count):
            coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            image = Image.fromarray(coarse).resize((resolution, resolution), Image.BICUBIC)
            image.save(tmp / "1_bench" / f"{i:05d}.jpg", quality=90)
        tmp.replace(root)
    return root


def kohya_tokenizer_dir(model: Path, cache: Path) -> Path:
    """A tokenizer_cache_dir in which sd-scripts finds the model's tokenizer by CLIP's name
    (it would download CLIP's otherwise); difftune reads the model folder's own."""
    folder = cache / "tokenizers"
    target = folder / KOHYA_TOKENIZER_NAME
    if not target.exists():
        shutil.copytree(model / "tokenizer", target)
    return folder


def case_text(keys: dict) -> str:
    """``keys`` as the flat TOML args file both trainers read."""
    import tomli_w

    return tomli_w.dumps(keys)


def write_case_config(case: Case, steps: int, cache: Path, folder: Path) -> Path:
    """The case as a flat kohya-style args file that both trainers read."""
    try:
        model = model_folder(case.model, cache, log=log)
    except UnknownModel as unknown:
        raise BenchError(str(unknown)) from None
    keys = {
        "pretrained_model_name_or_path": str(model),
        "train_data_dir": str(image_folder(case.resolution, cache)),
        "resolution": f"{case.resolution},{case.resolution}",  # kohya writes it as text
        "max_train_steps": steps,
        **COMMON_KEYS,
        **case.keys,
    }
    if case.kohya:
        keys["tokenizer_cache_dir"] = str(kohya_tokenizer_dir(model, cache))
    path = folder / "case.toml"
    path.write_text(case_text(keys), "utf-8")
    return path


# --- running ----------------------------------------------------------------------------------


@dataclass
class Run:
    """What one run measured."""

    step_times: list[float]  # wall clock after each optimizer step (the main process)
    started: float
    peak_rss_bytes: int
    cuda_max_allocated_bytes: int | None
    samples_per_step: int
    steps: list[dict] = field(default_factory=list)  # the main process's step records

    def figures(self, warmup: int) -> dict:
        gaps = [b - a for a, b in zip(self.step_times, self.step_times[1:], strict=False)]
        timed = gaps[warmup - 1 :] if warmup >= 1 else gaps
        if not timed:
            raise BenchError(
                f"{len(self.step_times)} optimizer steps leave none to time after "
                f"{warmup} warm-up steps; raise --steps"
            )
        median = statistics.median(timed)
        return {
            "seconds_per_step": round(median, 4),
            "mean_seconds_per_step": round(statistics.fmean(timed), 4),
            "steps_timed": len(timed),
            "images_per_second": round(self.samples_per_step / median, 3),
            "first_step_seconds": round(self.step_times[0] - self.started, 2),
            "peak_rss_bytes": self.peak_rss_bytes,
            "cuda_max_allocated_bytes": self.cuda_max_allocated_bytes,
        }


def _threads_env(processes: int, device: str) -> dict:
    env = dict(os.environ)
    if device == "cpu" and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // processes))
    return env


def launch(script: Path, config: Path, out: Path, processes: int, device: str, cwd: Path,
           python: str, samples_per_step: int, extra: list[str], step_memory: bool = False,
           environment: dict[str, str] | None = None) -> Run:  # fmt: skip
    """Run ``script --config_file config --output_dir out`` under the step timer
    (``step_memory``: with each step's peak memory, see bench/step_timer/sitecustomize.py),
    with ``environment`` added to this process's variables."""
    timer = out / "step-timer"
    timer.mkdir(parents=True)
    env = _threads_env(processes, device) | (environment or {})
    env["DIFFTUNE_STEP_TIMER"] = str(timer)
    if step_memory:
        env["DIFFTUNE_STEP_MEMORY"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TIMER_DIR), str(cwd), env.get("PYTHONPATH", "")) if p
    )
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["ACCELERATE_USE_CPU"] = "true"  # so that accelerate sets up gloo under torchrun
    args = [str(script), "--config_file", str(config), "--output_dir", str(out / "output"), *extra]
    if processes == 1:
        command = [python, *args]
    else:
        command = [python, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={processes}", *args]  # fmt: skip
    started = time.time()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    (out / "log.txt").write_text(result.stdout + result.stderr, encoding="utf-8")
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BenchError(f"{' '.join(command)} exited with {result.returncode}:\n{tail}")
    processes = read_step_timer(timer)
    if not processes:
        raise BenchError(f"{script} ran no optimizer step (see {out / 'log.txt'})")
    main = min(processes, key=lambda lines: lines[0]["rank"])
    last = [lines[-1] for lines in processes]  # the peaks so far, at each process's last step
    cuda = [r["cuda_max_allocated_bytes"] for r in last if r["cuda_max_allocated_bytes"]]
    return Run(
        step_times=[r["time"] for r in main],
        started=started,
        peak_rss_bytes=max(r["peak_rss_bytes"] for r in last),
        cuda_max_allocated_bytes=max(cuda) if cuda else None,
        samples_per_step=samples_per_step,
        steps=main,
    )


def read_step_timer(folder: Path) -> list[list[dict]]:
    """The step timer's records: a list of step records per process that stepped."""
    return [
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        for path in sorted(folder.glob("*.jsonl"))
    ]


def dry_run_plan(config: Path, device: str = "cuda") -> dict:
    """difftune's plan of ``config`` (``--dry_run --json``) on ``device``: the memory estimate
    is the device's."""
    env = dict(os.environ)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run(
        [sys.executable, str(REPO / "train_network.py"), "--config_file", str(config),
         "--output_dir", str(config.parent / "plan-output"), "--dry_run", "--json"],
        cwd=REPO, capture_output=True, text=True, env=env,
    )  # fmt: skip
    if result.returncode != 0:
        raise BenchError(f"{config}: the plan failed:\n{result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)


def samples_per_process(config: Path) -> float:
    """Samples per optimizer step and process (batch x accumulation), from difftune's plan."""
    plan = dry_run_plan(config)
    # one figure per dataset; datasets take turns, so their mean is the average step's
    return statistics.fmean(plan["effective_batch_sizes"]) / plan["processes"]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def describe_machine(device: str) -> dict:
    import torch

    info = {
        "device": device,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def bench(args: argparse.Namespace) -> list[dict]:
    cache = args.model_cache
    cache.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(args.device)
    log(f"machine: {machine}")
    results: list[dict] = []
    with work_folder("difftune-bench-", args.keep) as work:
        jobs = [(n, CASES[n]) for n in args.cases or ([] if args.config else DEFAULT_CASES)]
        if args.config:
            jobs.append((args.config.name, None))
        for name, case in jobs:
            results += bench_case(name, case, args, cache, work / name, machine)
    return results


@contextmanager
def work_folder(prefix: str, keep: bool) -> Iterator[Path]:
    """A new temporary folder for the runs, removed afterwards unless ``keep``."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        if keep:
            log(f"runs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark that trains shares: where models go, keeping the runs."""
    parser.add_argument("--model_cache", type=Path,
                        default=Path.home() / ".cache" / "difftune-bench",
                        help="where the models and images are written once")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders and logs")


def bench_case(name, case, args, cache, folder, machine) -> list[dict]:
    folder.mkdir(parents=True)
    if case is None:  # the user's config: their steps unless --steps is given
        config = args.config.resolve()
        extra = ["--max_train_steps", str(args.steps)] if args.steps else []
    else:
        config = write_case_config(case, args.steps or 12, cache, folder)
        extra = []
    trainers = [("difftune", REPO / "train_network.py", REPO, sys.executable)]
    if args.sd_scripts and case is not None and case.kohya:
        trainers.append(("sd-scripts", args.sd_scripts / "train_network.py", args.sd_scripts,
                         args.sd_scripts_python or sys.executable))  # fmt: skip
    results, single = [], {}
    per_process = samples_per_process(config)  # one plan: the batch does not change with N
    for processes in args.processes:
        per_step = round(per_process * processes)
        for repeat in range(args.repeats):
            for trainer, script, cwd, python in trainers:
                out = folder / f"{trainer}-{processes}p-{repeat}"
                run = launch(script, config, out, processes, args.device, cwd, python, per_step,
                             extra)  # fmt: skip
                figures = run.figures(args.warmup)
                record = {"case": name, "trainer": trainer, "processes": processes,
                          "repeat": repeat, **figures, "machine": machine}  # fmt: skip
                key = (trainer, repeat)
                if processes == 1:
                    single[key] = figures["images_per_second"]
                elif key in single:
                    record["scaling_efficiency"] = round(
                        figures["images_per_second"] / (processes * single[key]), 3
                    )
                results.append(record)
                print(json.dumps(record), flush=True)
                log(_line(record))
    if len(trainers) > 1:
        log(_comparison(name, results))
    return results


def _line(r: dict) -> str:
    rss = r["peak_rss_bytes"] / 2**30
    cuda = r["cuda_max_allocated_bytes"]
    memory = f"peak RSS {rss:.2f} GiB" + (f", CUDA {cuda / 2**30:.2f} GiB" if cuda else "")
    scaling = f", scaling {r['scaling_efficiency']:.0%}" if "scaling_efficiency" in r else ""
    return (
        f"{r['case']} [{r['trainer']}, {r['processes']} process(es), run {r['repeat']}]: "
        f"{r['seconds_per_step']:.3f} s/step (mean {r['mean_seconds_per_step']:.3f}), "
        f"{r['images_per_second']:.2f} images/s, first step after {r['first_step_seconds']:.1f} s, "
        f"{memory}{scaling}"
    )


def _comparison(name: str, results: list[dict]) -> str:
    """One line per process count: difftune's median s/step against sd-scripts'."""
    lines = []
    for processes in sorted({r["processes"] for r in results}):
        medians = {
            trainer: statistics.median(
                r["seconds_per_step"]
                for r in results
                if r["trainer"] == trainer and r["processes"] == processes
            )
            for trainer in ("difftune", "sd-scripts")
        }
        ours, theirs = medians["difftune"], medians["sd-scripts"]
        lines.append(
            f"{name}, {processes} process(es): difftune {ours:.3f} s/step, sd-scripts "
            f"{theirs:.3f} s/step: difftune takes {ours / theirs:.0%} of sd-scripts' time "
            f"({1 - ours / theirs:.0%} less)"
        )
    return "\n".join(lines)


def counts(least: int):
    """An argparse type: a whole number of at least ``least`` (argparse names the option)."""

    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is less than {least}")
        return value

    return count


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every argument checked before the first run, so that a mistake costs no case's time."""
    unknown = [name for name in args.cases or () if name not in CASES]
    if unknown:
        parser.error(f"--cases: unknown case {unknown[0]!r}; cases: {', '.join(CASES)}")
    if args.config is not None and not args.config.is_file():
        parser.error(f"--config {args.config}: no such file")  # before a case runs
    steps = args.steps or (12 if args.cases or not args.config else None)
    fewest = max(args.warmup, 1) + 1  # s/step times the gaps between steps after the warm-up
    if steps is not None and steps < fewest:
        parser.error(f"--steps {steps} leaves no step to time after --warmup {args.warmup}; "
                     f"use --steps {fewest} or more")  # fmt: skip
    if args.sd_scripts and not (args.sd_scripts / "train_network.py").is_file():
        parser.error(f"--sd_scripts {args.sd_scripts}: no train_network.py there")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="+", help=f"built-in cases: {', '.join(CASES)} "
                        f"(default: {' '.join(DEFAULT_CASES)})")  # fmt: skip
    parser.add_argument(
        "--config", type=Path, help="also run this config (a difftune or kohya file)"
    )
    parser.add_argument("--steps", type=counts(1),
                        help="optimizer steps per run (cases: 12)")  # fmt: skip
    parser.add_argument("--warmup", type=counts(0), default=2,
                        help="first steps left out of s/step")  # fmt: skip
    parser.add_argument("--processes", type=counts(1), nargs="+", default=[1],
                        help="process counts to run each case with (1 2: scaling)")  # fmt: skip
    parser.add_argument("--repeats", type=counts(1), default=1,
                        help="runs of each case and trainer")  # fmt: skip
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available")  # fmt: skip
    add_run_options(parser)
    parser.add_argument(
        "--sd_scripts",
        type=Path,
        help="a kohya-ss sd-scripts checkout: time its train_network.py too",
    )
    parser.add_argument(
        "--sd_scripts_python", help="the Python of sd-scripts' environment (default: this one)"
    )
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        bench(args)
    except BenchError as failed:
        log(f"error: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
