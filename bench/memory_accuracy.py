"""The dry run's memory estimate against the memory real training steps use.

    python bench/memory_accuracy.py                          # every case, on the CPU
    python bench/memory_accuracy.py --cases sd15-lora-512 flux6-lora-nf4
    python bench/memory_accuracy.py --device cuda            # on a GPU
    python bench/memory_accuracy.py --tensors                # the tensors alone (see below)
    python bench/memory_accuracy.py --markdown               # the table for docs/performance.md
    python bench/memory_accuracy.py --keep                   # keep the runs, then after a change:
    python bench/memory_accuracy.py --estimates_of /tmp/difftune-memory-*   # no training

Not a test and not timed in CI. For each case it writes a config (a kohya-style args file, as
bench/train_speed.py does), trains ``--steps`` optimizer steps with ``train_network.py`` under
the step timer's memory probe (bench/step_timer/sitecustomize.py), takes the largest peak of
the steps after the first (the first has no reset before it; they all hold the same tensors)
and the estimate the run's plan printed from its run summary (the dry run's, made on the
models' shapes, is the same figure).
The runs are plain: started as a user starts them, with no allocator setting the trainer does
not make itself (library/host_allocator.py applies its own). The measured peak is what the
process holds, which is what runs out: on the CPU, the process's peak resident set in a step
(the interpreter, its libraries and the allocator's kept memory included); on CUDA, PyTorch's
peak reserved memory plus what else the process has on the device (the CUDA context). Beside it
the tensors' own peak: on CUDA PyTorch's peak allocated memory; on the CPU the most tensor
memory alive at once, exact only with ``--tensors``, which has glibc map every block of 64 KiB
and more on its own so that freed memory leaves at once (a configuration no user runs, for
tuning the estimate's tensor counts). Each case also reports its CPU seconds and minor page
faults per step (the steps after the first), the cost of the allocator's settings.

The ratio is estimate / measured. The target is 0.90 to 1.25: an estimate below the real peak
is an out-of-memory crash the dry run promised away, one far above it refuses runs that fit.

Models (bench/random_models.py, written once to ``--model_cache``): SD 1.5 and SDXL at full
size, and FLUX.1 [dev] at its released widths with 6 of its 57 blocks (``flux-dev-6``; the whole
model does not fit a 24 GB machine's memory, and every block is the same shape, so the
estimate's error per block is the same). Images are the smooth synthetic JPEGs of
bench/train_speed.py. On 2 CPU cores the default cases take about 40 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

from bench.train_speed import (  # noqa: E402
    COMMON_KEYS,
    LORA,
    BenchError,
    Case,
    add_run_options,
    dry_run_plan,
    launch,
    log,
    read_step_timer,
    work_folder,
    write_case_config,
)

GIB = 1024**3
OUTPUT_NAME = COMMON_KEYS["output_name"]
LOW, HIGH = 0.90, 1.25  # the target band of estimate / measured

SD_LORA = {**LORA, "cache_latents": True}
XL_LORA = {**SD_LORA, "network_train_unet_only": True, "mixed_precision": "bf16"}
FLUX_LORA = {
    "network_module": "networks.lora_flux",
    "network_dim": 16,
    "network_alpha": 16,
    "network_train_unet_only": True,
    "cache_latents": True,
    "mixed_precision": "bf16",
    "timestep_sampling": "shift",
    "model_prediction_type": "raw",
    "guidance_scale": 1.0,
}
CASES = {
    "sd15-lora-512": Case("sd15", 512, SD_LORA, about="UNet + text encoder LoRA, float32"),
    "sd15-lora-256-b4": Case(
        "sd15", 256, {**SD_LORA, "train_batch_size": 4}, about="batch 4, float32"
    ),
    "sd15-lora-512-bf16": Case(
        "sd15", 512, {**SD_LORA, "mixed_precision": "bf16"}, about="bf16 mixed precision"
    ),
    "sd15-lora-768-ckpt": Case(
        "sd15",
        768,
        {**SD_LORA, "gradient_checkpointing": True, "train_batch_size": 2},
        about="768 px, batch 2, gradient checkpointing",
    ),
    "sd15-lora-512-uncached": Case(
        "sd15", 512, LORA, about="latents encoded in each step (not cached)"
    ),
    "sd15-full-256": Case(
        "sd15", 256, {"train_mode": "unet", "learning_rate": 1e-5}, about="whole UNet, AdamW"
    ),
    "sd15-full-256-foreach": Case(
        "sd15",
        256,
        {"train_mode": "unet", "learning_rate": 1e-5, "optimizer_args": ["foreach=True"]},
        about="whole UNet, AdamW updating all at once (CUDA's default)",
    ),
    "sd15-full-256-8bit": Case(
        "sd15",
        256,
        {"train_mode": "unet", "learning_rate": 1e-5, "optimizer_type": "AdamW8bit"},
        about="whole UNet, AdamW8bit",
    ),
    "sdxl-lora-512": Case("sdxl", 512, XL_LORA, about="UNet LoRA, bf16"),
    "sdxl-lora-512-fp8": Case("sdxl", 512, {**XL_LORA, "fp8_base": True}, about="fp8_base"),
    "sdxl-lora-512-nf4": Case(
        "sdxl", 512, {**XL_LORA, "base_model_precision": "nf4-bnb"}, about="nf4 UNet"
    ),
    "flux6-lora-512": Case("flux-dev-6", 512, FLUX_LORA, about="transformer LoRA, bf16"),
    "flux6-lora-512-ckpt": Case(
        "flux-dev-6",
        512,
        {**FLUX_LORA, "gradient_checkpointing": True},
        about="gradient checkpointing",
    ),
    "flux6-lora-512-int8": Case(
        "flux-dev-6", 512, {**FLUX_LORA, "base_model_precision": "int8-bnb"}, about="int8"
    ),
    "flux6-lora-512-nf4": Case(
        "flux-dev-6",
        512,
        {**FLUX_LORA, "base_model_precision": "nf4-bnb", "fp8_base": True},
        about="nf4 transformer, fp8 text encoders",
    ),
    "flux6-lora-512-swap": Case(
        "flux-dev-6",
        512,
        {**FLUX_LORA, "fp8_base": True, "blocks_to_swap": 3},
        about="fp8_base, 3 blocks swapped",
    ),
}


@dataclass(frozen=True)
class Peaks:
    """A run's step peaks after its first step, in bytes (see the module docstring), and what a
    step costs: CPU seconds and minor page faults (medians)."""

    process: int
    tensors: int | None
    cpu_seconds: float | None = None
    faults: int | None = None


@dataclass(frozen=True)
class Measured:
    """One case's estimate and measured peaks, in bytes."""

    case: str
    about: str
    estimate: int
    peaks: Peaks

    @property
    def measured(self) -> int:
        return self.peaks.process

    @property
    def ratio(self) -> float:
        return self.estimate / self.measured

    @property
    def inside(self) -> bool:
        return LOW <= self.ratio <= HIGH

    def record(self) -> dict:
        return {
            "case": self.case,
            "estimate_bytes": self.estimate,
            "measured_peak_bytes": self.measured,
            "tensor_peak_bytes": self.peaks.tensors,
            "cpu_seconds_per_step": self.peaks.cpu_seconds,
            "minor_faults_per_step": self.peaks.faults,
            "ratio": round(self.ratio, 3),
            "inside_target": self.inside,
        }


def measured_peak(steps: list[dict], device: str) -> Peaks:
    """The largest step peaks after the first step, from the step timer's records: the
    process's (on CUDA reserved + context) and the tensors' (on CUDA allocated)."""
    if device == "cuda":
        process = [r["cuda_step_peak_reserved_bytes"] + r["cuda_context_bytes"]
                   for r in steps if "cuda_step_peak_reserved_bytes" in r]  # fmt: skip
        tensors = [r["cuda_step_peak_allocated_bytes"] for r in steps
                   if "cuda_step_peak_allocated_bytes" in r]  # fmt: skip
    else:
        process = [r["step_peak_rss_bytes"] for r in steps if "step_peak_rss_bytes" in r]
        tensors = [r["step_peak_bytes"] for r in steps if "step_peak_bytes" in r]
    if not process:
        raise BenchError("no step peak was recorded: raise --steps to 2 or more")
    return Peaks(max(process), max(tensors, default=None), *_step_costs(steps))


def _step_costs(steps: list[dict]) -> tuple[float | None, int | None]:
    """Median CPU seconds and minor page faults of the steps after the first."""
    pairs = list(zip(steps, steps[1:], strict=False))
    if not pairs or "cpu_seconds" not in steps[0]:
        return None, None
    seconds = statistics.median(b["cpu_seconds"] - a["cpu_seconds"] for a, b in pairs)
    faults = statistics.median(b["minor_faults"] - a["minor_faults"] for a, b in pairs)
    return round(seconds, 2), int(faults)


def run_summary(output: Path) -> dict:
    """The run summary of the benchmark run whose output folder is ``output``."""
    return json.loads((output / f"{OUTPUT_NAME}-summary.json").read_text(encoding="utf-8"))


def run_estimate(output: Path) -> int:
    """The plan's memory estimate of the run whose output folder is ``output``, from its run
    summary (the estimate made on the loaded models, which the dry run makes on their shapes)."""
    estimate = run_summary(output)["memory"]["estimated_peak_bytes"]
    if estimate is None:
        raise BenchError(f"{output}: the run made no memory estimate")
    return estimate


def measure(name: str, case: Case, args, folder: Path) -> Measured:
    folder.mkdir(parents=True)
    config = write_case_config(case, args.steps, args.model_cache, folder)
    run = launch(REPO / "train_network.py", config, folder / "run", 1, args.device, REPO,
                 sys.executable, case.keys.get("train_batch_size", 1), [],
                 step_memory=True, environment=run_environment(args))  # fmt: skip
    peaks = _exact(measured_peak(run.steps, args.device), args)
    return Measured(name, case.about, run_estimate(folder / "run" / "output"), peaks)


def _exact(peaks: Peaks, args) -> Peaks:
    """``peaks`` without the CPU's tensor peak unless ``--tensors`` made it exact."""
    if args.device == "cuda" or args.tensors:
        return peaks
    return replace(peaks, tensors=None)


def run_environment(args) -> dict[str, str]:
    """The variables the runs get beyond this process's: ``--env``, and with ``--tensors``
    glibc's threshold that maps every block of 64 KiB and more on its own (freed memory leaves
    the resident set at once, so its rise is the tensors')."""
    env = dict(item.split("=", 1) for item in args.env)
    if args.tensors:
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    return env


def remeasure(name: str, case: Case, args, folder: Path) -> Measured:
    """A kept run's measured peak (``--keep``) beside the estimate of the code as it is now:
    the dry run's on the run's own config (the same figure the run's plan prints)."""
    processes = read_step_timer(folder / "run" / "step-timer")
    if not processes:
        raise BenchError(f"{folder}: no kept run of {name} there")
    peaks = _exact(measured_peak(processes[0], args.device), args)
    plan = dry_run_plan(folder / "case.toml", args.device)
    return Measured(name, case.about, plan["memory"]["peak_bytes"], peaks)


def line(m: Measured) -> str:
    tensors = f", tensors {m.peaks.tensors / GIB:.2f} GiB" if m.peaks.tensors else ""
    cost = ""
    if m.peaks.cpu_seconds is not None:
        cost = f"; a step: {m.peaks.cpu_seconds:.1f} CPU s, {m.peaks.faults} page faults"
    verdict = "inside" if m.inside else "OUTSIDE"
    return (
        f"{m.case} ({m.about}): estimate {m.estimate / GIB:.2f} GiB, measured "
        f"{m.measured / GIB:.2f} GiB{tensors}, ratio {m.ratio:.2f} ({verdict} "
        f"{LOW:.2f} to {HIGH:.2f}){cost}"
    )


def table(results: list[Measured]) -> str:
    rows = [
        "| case | what | estimate | measured | ratio | tensors alone |",
        "|---|---|---|---|---|---|",
    ]
    for m in results:
        tensors = f"{m.peaks.tensors / GIB:.2f} GiB" if m.peaks.tensors else ""
        rows.append(
            f"| `{m.case}` | {m.about} | {m.estimate / GIB:.2f} GiB | "
            f"{m.measured / GIB:.2f} GiB | {m.ratio:.2f} | {tensors} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per case")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--markdown", action="store_true", help="print the table at the end")
    parser.add_argument("--tensors", action="store_true",
                        help="on the CPU, have glibc return freed memory at once, so that the "
                        "tensors' own peak is exact (not the process a user runs)")  # fmt: skip
    parser.add_argument(
        "--env",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help="variables for the runs, e.g. allocator settings to compare",
    )
    add_run_options(parser)
    parser.add_argument("--estimates_of", type=Path, nargs="+", metavar="FOLDER",
                        help="train nothing: the runs kept (--keep) in these folders, each "
                        "beside the estimate of the code as it is now (tuning the estimate)")  # fmt: skip
    args = parser.parse_args(argv)
    kept = {}
    for folder in args.estimates_of or ():
        kept |= {p.name: p for p in folder.iterdir() if p.name in CASES}
    results = []
    with work_folder("difftune-memory-", args.keep and not args.estimates_of) as work:
        for name in args.cases:
            try:
                found = _case(name, args, kept, work)
            except BenchError as failed:
                log(f"{name}: error: {failed}")
                continue
            results.append(found)
            log(line(found))
            if not args.markdown:
                print(json.dumps(found.record()), flush=True)
    if args.markdown:
        print(table(results))
    outside = [m.case for m in results if not m.inside]
    if outside:
        log(f"outside the target: {', '.join(outside)}")
    return 1 if outside or len(results) < len(args.cases) else 0


def _case(name: str, args, kept: dict[str, Path], work: Path) -> Measured:
    if not args.estimates_of:
        return measure(name, CASES[name], args, work / name)
    if name not in kept:
        raise BenchError(f"no kept run of {name} in {' '.join(map(str, args.estimates_of))}")
    return remeasure(name, CASES[name], args, kept[name])


if __name__ == "__main__":
    sys.exit(main())
