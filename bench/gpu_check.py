"""Run this first on a new GPU machine: short real trainings of SD 1.5, SDXL and FLUX.1 [dev] at
their released sizes, one line each with speed, memory and how much of the GPU a step uses.

    python bench/gpu_check.py                      # every check, on the GPU
    python bench/gpu_check.py --checks sd15-bf16 flux-nf4
    python bench/gpu_check.py --json gpu.json      # the figures as JSON too
    python bench/gpu_check.py --tiny               # the tiny test models (CI runs it on the CPU)

Nothing is downloaded. The first run writes random-weight models at the released shapes into
``--model_cache`` (bench/random_models.py: about 2 GB for SD 1.5, 7 GB for SDXL, 33 GB for
FLUX.1 [dev] with T5-XXL), drawn on the GPU; later runs reuse them. Each check is
``train_network.py`` itself, started as a user starts it, on synthetic images, with the step
timer's memory probe (bench/step_timer/sitecustomize.py). Per check it prints:

- s/step: the median time between optimizer steps after the first ``--warmup`` steps, and
  images/s (the batch over s/step);
- peak memory of a step: what the process holds (on CUDA PyTorch's peak reserved memory plus
  the CUDA context; on the CPU the peak resident set) and, in brackets, the tensors' own peak
  (PyTorch's peak allocated memory), beside the estimate the run's plan printed, with the
  ratio of the estimate to the process's peak (bench/memory_accuracy.py);
- MFU: the step's model FLOPs (library/training/step_flops.py, counted on the models' shapes)
  over s/step, as a fraction of the GPU's dense bf16 peak (``PEAK_TFLOPS`` by the name CUDA
  gives; ``--peak_tflops`` for another GPU).

A check whose estimate is more than the GPU holds is refused by the run itself before it loads
a weight (the dry run's check), and reported as such: on a 24 GB card FLUX.1 trains with its
fp8 or nf4 base and swapped blocks, not in bf16. The checks exercise every path that only runs
on CUDA: fp16 mixed precision and its loss scaler, pinned host memory and the transfers of block
swap, bitsandbytes' 8-bit and paged optimizers, the fused attention kernels, CUDA's foreach
AdamW. A check that fails prints the run's last lines and the command exits with 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

from bench.memory_accuracy import measured_peak, run_summary  # noqa: E402
from bench.train_speed import (  # noqa: E402
    BenchError,
    Case,
    add_run_options,
    describe_machine,
    launch,
    log,
    work_folder,
    write_case_config,
)
from library.training.memory_check import show_bytes  # noqa: E402

# Dense (no sparsity) bf16 tensor throughput with float32 accumulation, TFLOP/s, from the
# vendors' data sheets; matched against torch.cuda.get_device_name() in this order.
PEAK_TFLOPS = (
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("GH200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
    ("RTX A6000", 155.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
)

SD_LORA = {"network_module": "networks.lora", "network_dim": 16, "network_alpha": 16,
           "cache_latents": True, "mixed_precision": "bf16"}  # fmt: skip
FLUX_LORA = {
    "network_module": "networks.lora_flux",
    "network_dim": 16,
    "network_alpha": 16,
    "network_train_unet_only": True,
    "cache_latents": True,
    "cache_text_encoder_outputs": True,
    "mixed_precision": "bf16",
    "timestep_sampling": "shift",
    "model_prediction_type": "raw",
    "guidance_scale": 1.0,
    "gradient_checkpointing": True,
}


@dataclass(frozen=True)
class Check:
    """One check: a case of bench/train_speed.py, and whether it needs CUDA."""

    case: Case
    cuda_only: bool = False


def _check(model, resolution, keys, about, batch=1, cuda_only=False) -> Check:
    keys = {**keys, "train_batch_size": batch}
    return Check(Case(model, resolution, keys, about=about), cuda_only)


CHECKS = {
    "sd15-bf16": _check("sd15", 512, SD_LORA, "SD 1.5 LoRA, bf16, AdamW, SDPA", batch=4),
    "sd15-plain-attention": _check(
        "sd15", 512, {**SD_LORA, "sdpa": False}, "the same, plain attention", batch=4
    ),
    "sd15-fp16": _check(
        "sd15",
        512,
        {**SD_LORA, "mixed_precision": "fp16", "optimizer_type": "AdamW8bit"},
        "fp16 with the loss scaler, AdamW8bit",
        batch=4,
        cuda_only=True,
    ),  # fmt: skip
    "sd15-full": _check(
        "sd15",
        512,
        {
            "train_mode": "unet",
            "learning_rate": 1e-5,
            "mixed_precision": "bf16",
            "cache_latents": True,
            "gradient_checkpointing": True,
            "optimizer_type": "PagedAdamW8bit",
        },
        "SD 1.5 whole UNet, checkpointing, PagedAdamW8bit",
        batch=4,
        cuda_only=True,
    ),  # fmt: skip
    "sdxl-bf16": _check(
        "sdxl",
        1024,
        {**SD_LORA, "network_train_unet_only": True},
        "SDXL LoRA 1024 px, bf16, AdamW",
    ),  # fmt: skip
    "sdxl-checkpointing": _check(
        "sdxl",
        1024,
        {
            **SD_LORA,
            "network_train_unet_only": True,
            "gradient_checkpointing": True,
            "optimizer_type": "AdamW8bit",
        },
        "SDXL LoRA 1024 px, checkpointing, AdamW8bit",
        batch=2,
    ),  # fmt: skip
    "flux-bf16": _check("flux-dev", 1024, FLUX_LORA, "FLUX.1 [dev] LoRA 1024 px, bf16 base"),
    "flux-fp8-swap": _check(
        "flux-dev",
        1024,
        {**FLUX_LORA, "fp8_base": True, "blocks_to_swap": 18},
        "FLUX.1 [dev], fp8 base, 18 blocks swapped (24 GB cards)",
        cuda_only=True,
    ),  # fmt: skip
    "flux-nf4": _check(
        "flux-dev",
        1024,
        {
            **FLUX_LORA,
            "base_model_precision": "nf4-bnb",
            "fp8_base": True,
            "optimizer_type": "AdamW8bit",
        },
        "FLUX.1 [dev], nf4 base, fp8 text encoders, AdamW8bit",
    ),  # fmt: skip
}
TINY_CHECKS = {
    "tiny-sd1": _check(
        "tiny-sd1",
        64,
        {**SD_LORA, "mixed_precision": "no"},
        "tiny SD 1.x LoRA, AdamW, SDPA",
        batch=2,
    ),  # fmt: skip
    "tiny-sdxl": _check(
        "tiny-sdxl",
        64,
        {
            **SD_LORA,
            "mixed_precision": "no",
            "sdpa": False,
            "gradient_checkpointing": True,
            "optimizer_type": "AdamW8bit",
        },
        "tiny SDXL LoRA, plain attention, checkpointing, AdamW8bit",
        batch=2,
    ),  # fmt: skip
    "tiny-flux": _check(
        "tiny-flux",
        64,
        {
            **FLUX_LORA,
            "bucket_reso_steps": 16,
            "base_model_precision": "nf4-bnb",
            "fp8_base": True,
            "blocks_to_swap": 1,
        },
        "tiny FLUX.1 LoRA, nf4 base, fp8 text encoders, 1 block swapped",
    ),  # fmt: skip
}


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``device_name``, or None when unknown."""
    for name, tflops in PEAK_TFLOPS:
        if name.lower() in device_name.lower():
            return tflops
    return None


def case_step_flops(config_path: Path, case: Case) -> int:
    """Model FLOPs of one optimizer step of ``case`` (one process), on the models' shapes."""
    from library.config.loader import load_config
    from library.models.loader import load_components
    from library.models.model_files import shapes_only
    from library.training.meta_activations import TrainingSize
    from library.training.setup import WEIGHT_DTYPES, setup_training
    from library.training.step_flops import step_flops

    config = load_config(str(config_path))
    with shapes_only():
        components = load_components(
            config.model,
            WEIGHT_DTYPES[config.training.mixed_precision],
            config.flow,
            config.network.network_module,
        )
        parts = setup_training(config, components)
    size = TrainingSize(case.resolution, case.resolution, case.keys["train_batch_size"])
    return step_flops(config, parts, size)


def run_check(name: str, check: Check, args, folder: Path, peak: float | None) -> dict:
    """Train the check's steps and return its record (see the module docstring)."""
    case = check.case
    record = {"check": name, "about": case.about}
    if check.cuda_only and args.device != "cuda":
        return {**record, "status": "skipped", "reason": "needs CUDA"}
    folder.mkdir(parents=True)
    config = write_case_config(case, args.steps, args.model_cache, folder)
    batch = case.keys["train_batch_size"]
    started = time.time()
    try:
        run = launch(REPO / "train_network.py", config, folder / "run", 1, args.device, REPO,
                     sys.executable, batch, [], step_memory=True)  # fmt: skip
    except BenchError as failed:
        refused = "exceeds" in str(failed) and "memory" in str(failed)
        status = "refused" if refused else "failed"
        return {**record, "status": status, "reason": _last_error(str(failed))}
    figures = run.figures(args.warmup)
    summary = run_summary(folder / "run" / "output")
    if summary["last_loss"] is None:  # every step was dropped or skipped: not a working run
        return {**record, "status": "failed", "reason": "no step had a finite loss"}
    try:
        peaks = measured_peak(run.steps, args.device)
    except BenchError:  # no step peak recorded (a CPU whose /proc cannot be reset)
        peaks = None
    process = peaks.process if peaks else None
    flops = case_step_flops(config, case)
    seconds = figures["seconds_per_step"]
    estimate = summary["memory"]["estimated_peak_bytes"]
    record |= {
        "status": "ok",
        "seconds_per_step": seconds,
        "images_per_second": figures["images_per_second"],
        "peak_process_bytes": process,
        "peak_tensor_bytes": peaks.tensors if peaks else None,
        "estimated_peak_bytes": estimate,
        "estimate_ratio": round(estimate / process, 3) if estimate and process else None,
        "step_flops": flops,
        "achieved_flops_per_second": round(flops / seconds),
        "mfu": round(flops / seconds / (peak * 1e12), 3) if peak else None,
        "last_loss": summary["last_loss"],
        "wall_seconds": round(time.time() - started, 1),
    }
    return record


def _last_error(text: str) -> str:
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    return errors[-1] if errors else text.strip().splitlines()[-1]


def line(r: dict) -> str:
    """The check's line (see the module docstring)."""
    if r["status"] != "ok":
        return f"{r['check']} ({r['about']}): {r['status']}: {r['reason']}"
    memory = "peak memory not measured"
    if r["peak_process_bytes"]:
        memory = f"peak {show_bytes(r['peak_process_bytes'])}"
        if r["peak_tensor_bytes"]:
            memory += f" ({show_bytes(r['peak_tensor_bytes'])} of tensors)"
        if r["estimate_ratio"]:
            estimate = show_bytes(r["estimated_peak_bytes"])
            memory += f", estimate {estimate} ({r['estimate_ratio']:.2f}x)"
    rate = r["achieved_flops_per_second"]
    speed = f"{rate / 1e12:.1f} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.2f} GFLOP/s"
    mfu = f", MFU {r['mfu']:.0%}" if r["mfu"] is not None else ""
    return (
        f"{r['check']} ({r['about']}): {r['seconds_per_step']:.3f} s/step, "
        f"{r['images_per_second']:.2f} images/s, {memory}, {speed}{mfu}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checks", nargs="+", help="which checks (default: all; with --tiny "
                        f"the tiny ones): {', '.join([*CHECKS, *TINY_CHECKS])}")  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="the tiny models' checks")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per check")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of s/step")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available")  # fmt: skip
    parser.add_argument("--peak_tflops", type=float,
                        help="the GPU's dense bf16 TFLOP/s, for a GPU not in the table")  # fmt: skip
    add_run_options(parser)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    known = {**CHECKS, **TINY_CHECKS}
    names = args.checks or list(TINY_CHECKS if args.tiny else CHECKS)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown checks {', '.join(unknown)}; checks: {', '.join(known)}")
    if args.steps <= args.warmup:
        parser.error(f"--steps {args.steps} leaves no step to time after --warmup {args.warmup}")
    machine = describe_machine(args.device)
    peak = args.peak_tflops
    if peak is None and args.device == "cuda":
        peak = peak_tflops(machine["gpu"])
    log(f"machine: {machine}; bf16 peak: {f'{peak:g} TFLOP/s' if peak else 'unknown'}")
    if args.device == "cuda":  # draw the models' random weights on the GPU: minutes faster
        _prepare_models(names, known, args)
    results = []
    with work_folder("difftune-gpu-check-", args.keep) as work:
        for name in names:
            record = run_check(name, known[name], args, work / name, peak)
            results.append(record)
            log(line(record))
            print(json.dumps(record), flush=True)
    if args.json:
        report = {"machine": machine, "peak_tflops": peak, "checks": results}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    failed = [r["check"] for r in results if r["status"] == "failed"]
    ran = [r for r in results if r["status"] == "ok"]
    if ran:
        mean = statistics.fmean(r["wall_seconds"] for r in ran)
        log(f"{len(ran)} of {len(results)} checks ran ({mean:.0f} s each on average)")
    if failed:
        log(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def _prepare_models(names: list[str], known: dict, args) -> None:
    from bench.random_models import model_folder

    for model in dict.fromkeys(known[n].case.model for n in names):
        model_folder(model, args.model_cache, device="cuda", log=log)


if __name__ == "__main__":
    sys.exit(main())
