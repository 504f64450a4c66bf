"""The dry run's memory estimate against the memory real training steps use.

    python bench/memory_accuracy.py                          # every case, on the CPU
    python bench/memory_accuracy.py --cases sd15-lora-512 flux6-lora-nf4
    python bench/memory_accuracy.py --device cuda            # a GPU's allocated peaks
    python bench/memory_accuracy.py --markdown               # the table for docs/performance.md
    python bench/memory_accuracy.py --keep                   # keep the runs, then after a change:
    python bench/memory_accuracy.py --estimates_of /tmp/difftune-memory-*   # no training

Not a test and not timed in CI. For each case it writes a config (a kohya-style args file, as
bench/train_speed.py does), trains ``--steps`` optimizer steps with ``train_network.py`` under
the step timer's memory probe (bench/step_timer/sitecustomize.py), takes the largest peak of
the steps after the first (the first has no reset before it; they all hold the same tensors)
and the estimate the run's plan printed from its run summary (the dry run's, made on the
models' shapes, is the same figure).
The measured peak is, on the CPU, the most tensor memory alive at once (the resident set's rise
over the tensors alive at each step, the interpreter and its libraries left out); on CUDA,
PyTorch's peak allocated memory (the reserved peak is printed beside it: the caching
allocator's slack, which the estimate does not count).

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
import sys
from dataclasses import dataclass
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
class Measured:
    """One case's estimate and measured peak, in bytes."""

    case: str
    about: str
    estimate: int
    measured: int
    reserved: int | None  # CUDA's reserved peak

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
            "reserved_peak_bytes": self.reserved,
            "ratio": round(self.ratio, 3),
            "inside_target": self.inside,
        }


def measured_peak(steps: list[dict], device: str) -> tuple[int, int | None]:
    """The largest step peak after the first step (and CUDA's reserved peak), from the step
    timer's records."""
    key = "cuda_step_peak_allocated_bytes" if device == "cuda" else "step_peak_bytes"
    peaks = [r[key] for r in steps if key in r]
    if not peaks:
        raise BenchError("no step peak was recorded: raise --steps to 2 or more")
    reserved = [r["cuda_step_peak_reserved_bytes"] for r in steps
                if "cuda_step_peak_reserved_bytes" in r]  # fmt: skip
    return max(peaks), max(reserved) if reserved else None


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
                 step_memory=True)  # fmt: skip
    measured, reserved = measured_peak(run.steps, args.device)
    return Measured(name, case.about, run_estimate(folder / "run" / "output"), measured, reserved)


def remeasure(name: str, case: Case, args, folder: Path) -> Measured:
    """A kept run's measured peak (``--keep``) beside the estimate of the code as it is now:
    the dry run's on the run's own config (the same figure the run's plan prints)."""
    processes = read_step_timer(folder / "run" / "step-timer")
    if not processes:
        raise BenchError(f"{folder}: no kept run of {name} there")
    measured, reserved = measured_peak(processes[0], args.device)
    plan = dry_run_plan(folder / "case.toml", args.device)
    return Measured(name, case.about, plan["memory"]["peak_bytes"], measured, reserved)


def line(m: Measured) -> str:
    reserved = f", reserved {m.reserved / GIB:.2f} GiB" if m.reserved else ""
    verdict = "inside" if m.inside else "OUTSIDE"
    return (
        f"{m.case} ({m.about}): estimate {m.estimate / GIB:.2f} GiB, measured "
        f"{m.measured / GIB:.2f} GiB{reserved}, ratio {m.ratio:.2f} ({verdict} "
        f"{LOW:.2f} to {HIGH:.2f})"
    )


def table(results: list[Measured]) -> str:
    rows = ["| case | what | estimate | measured | ratio |", "|---|---|---|---|---|"]
    for m in results:
        rows.append(
            f"| `{m.case}` | {m.about} | {m.estimate / GIB:.2f} GiB | "
            f"{m.measured / GIB:.2f} GiB | {m.ratio:.2f} |"
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
