"""Gradient communication of a LoRA on an SD 1.5-size UNet, per optimizer step, on CPU processes.

    python bench/ddp_comm.py                      # 1 and 2 processes, accumulation 1, 4 and 8
    python bench/ddp_comm.py --latent 32 --steps 4   # closer to real work, slower

Not a test and not timed in CI. It drives the model directly with accelerate, in the trainer's
pattern (one Accelerator with gradient accumulation, the LoRA injected into the UNet by
library.networks.lora.apply_lora, the UNet prepared and so wrapped in DistributedDataParallel
under several processes, ``accelerator.accumulate(unet)`` around every micro-batch), not through
train_network.py: no VAE, text encoder or data, only random latents, timesteps and width-768
encoder states, so the measurement is the UNet's forward/backward and DDP's gradient sync.

The UNet is built from SD 1.5's config (written below) with random weights. A DDP communication
hook that calls DDP's default all-reduce counts the collectives and bytes per optimizer step.
It prints, per layout, the step's collectives, bytes all-reduced and wall time, and how many
collectives a per-tensor hand-written all-reduce would issue instead. The parent process starts
one ``torchrun`` per process count (gloo on CPU, one thread per process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

SD15_UNET = {  # runwayml/stable-diffusion-v1-5 unet/config.json, the fields that shape the net
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 2,
    "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    "cross_attention_dim": 768,
    "attention_head_dim": 8,
    "norm_num_groups": 32,
}
SD15_TEXT = {  # CLIP ViT-L/14 text tower as SD 1.5 ships it
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
}


def adapter_tensor_counts(rank: int) -> dict[str, int]:
    """Trained LoRA tensors (down + up per adapted layer) of SD 1.5's UNet and text encoder."""
    import torch
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from library.networks.lora import LoraSpec, apply_lora, lora_parameters

    spec = LoraSpec(rank, float(rank))
    with torch.device("meta"):  # shapes only: nothing is allocated
        unet = UNet2DConditionModel(**SD15_UNET)
        text = CLIPTextModel(CLIPTextConfig(**SD15_TEXT))
    apply_lora(unet, "unet", spec)
    apply_lora(text, "text_encoder", spec)
    return {"unet": len(lora_parameters(unet)), "text_encoder": len(lora_parameters(text))}


class CommCounter:
    """DDP communication hook: DDP's default all-reduce, counted (calls, bytes, time in flight)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = self.bytes = 0
        self.in_flight = 0.0

    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        buffer = bucket.buffer()
        self.calls += 1
        self.bytes += buffer.numel() * buffer.element_size()
        start = time.perf_counter()

        def done(fut):
            self.in_flight += time.perf_counter() - start
            return fut.value()

        return allreduce_hook(None, bucket).then(done)


@contextmanager
def count_wrap_broadcast():
    """Bytes DDP broadcasts from rank 0 when it wraps the model (all weights, frozen ones too)."""
    import torch.distributed as dist

    total = [0]
    original = getattr(dist, "_broadcast_coalesced", None)

    def counted(group, tensors, *args, **kwargs):
        total[0] += sum(t.numel() * t.element_size() for t in tensors)
        return original(group, tensors, *args, **kwargs)

    if original is not None:
        dist._broadcast_coalesced = counted
    try:
        yield total
    finally:
        if original is not None:
            dist._broadcast_coalesced = original


def transfer_times(params, repeats: int = 3) -> dict[str, float]:
    """Seconds to all-reduce the adapter gradients alone, with every rank ready (best of N):
    as one flat buffer (what DDP's buckets amount to) and as one blocking call per tensor."""
    import torch
    import torch.distributed as dist

    def timed(tensors) -> float:
        best = float("inf")
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            for tensor in tensors:
                dist.all_reduce(tensor)
            best = min(best, time.perf_counter() - start)
        return best

    flat = [torch.zeros(sum(p.numel() for p in params))]
    per_tensor = [torch.zeros_like(p) for p in params]
    return {"flat_s": timed(flat), "per_tensor_s": timed(per_tensor)}


def worker(args) -> None:
    """One process of a layout: measure every accumulation count, rank 0 writes the results."""
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    from diffusers import UNet2DConditionModel

    from library.networks.lora import LoraSpec, apply_lora, lora_parameters

    torch.manual_seed(0)
    unet = UNet2DConditionModel(**SD15_UNET)
    apply_lora(unet, "unet", LoraSpec(args.rank, float(args.rank)))
    params = lora_parameters(unet)
    accelerator = Accelerator(
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)],
        step_scheduler_with_optimizer=False,
    )
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    with count_wrap_broadcast() as wrap_bytes:
        unet, optimizer = accelerator.prepare(unet, optimizer)
    unet.train()
    counter = CommCounter()
    if isinstance(unet, torch.nn.parallel.DistributedDataParallel):
        unet.register_comm_hook(None, counter.hook)
    gen = torch.Generator().manual_seed(1000 + accelerator.process_index)

    def micro_batch() -> None:
        with accelerator.accumulate(unet):
            latents = torch.randn(1, 4, args.latent, args.latent, generator=gen)
            hidden = torch.randn(1, 77, 768, generator=gen)
            timesteps = torch.randint(0, 1000, (1,), generator=gen)
            prediction = unet(latents, timesteps, hidden).sample
            accelerator.backward(F.mse_loss(prediction, latents))
            optimizer.step()  # a no-op until the window's last micro-batch
            optimizer.zero_grad(set_to_none=True)

    accelerator.gradient_accumulation_steps = 1
    micro_batch()  # one unmeasured optimizer step: DDP rebuilds its buckets after the first
    results = []
    for accumulation in args.accumulations:
        accelerator.gradient_accumulation_steps = accumulation
        accelerator.step = 0
        counter.reset()
        start = time.perf_counter()
        for _ in range(args.steps * accumulation):
            micro_batch()
        seconds = (time.perf_counter() - start) / args.steps
        results.append(
            {
                "processes": accelerator.num_processes,
                "accumulation": accumulation,
                "collectives": counter.calls / args.steps,
                "bytes": counter.bytes / args.steps,
                "in_flight_s": counter.in_flight / args.steps,
                "seconds": seconds,
                "samples": accumulation * accelerator.num_processes,
            }
        )
    transfer = transfer_times(params) if accelerator.num_processes > 1 else {}
    if accelerator.is_main_process:
        meta = {
            **transfer,
            "lora_tensors": len(params),
            "lora_numel": sum(p.numel() for p in params),
            "wrap_broadcast_bytes": wrap_bytes[0],
        }
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}), encoding="utf-8")


def launch(processes: int, args, out: Path) -> dict:
    """Run the workers: plain python for 1 process (no DDP at all), torchrun for several."""
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        launcher += ["--master_addr", "127.0.0.1", "--master_port", str(args.port)]
    command = [
        *launcher, __file__, "--worker", "--out", str(out), "--latent", str(args.latent),
        "--rank", str(args.rank), "--steps", str(args.steps),
        "--accumulations", *map(str, args.accumulations),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True)
    return json.loads(out.read_text(encoding="utf-8"))


def report(args, runs: dict[int, dict]) -> str:
    counts = adapter_tensor_counts(args.rank)
    meta = runs[1]["meta"]
    wrap = max(run["meta"]["wrap_broadcast_bytes"] for run in runs.values())
    lines = [
        f"SD 1.5 UNet (random weights), LoRA rank {args.rank} on the UNet: {meta['lora_tensors']} "
        f"trained tensors, {meta['lora_numel']:,} parameters "
        f"({meta['lora_numel'] * 4 / 2**20:.1f} MiB of fp32 gradients)",
        f"latents 1x4x{args.latent}x{args.latent}, encoder states 1x77x768, batch 1 per process, "
        f"gloo on CPU, 1 thread per process; {args.steps} measured optimizer steps per row",
        "",
        "processes  accumulation  samples/step  collectives/step  MiB all-reduced/step  "
        "all-reduce in flight/step  wall s/step  samples/s",
    ]
    for processes in sorted(runs):
        for r in runs[processes]["results"]:
            lines.append(
                f"{processes:>9}  {r['accumulation']:>12}  {r['samples']:>12}  "
                f"{r['collectives']:>16.0f}  {r['bytes'] / 2**20:>20.1f}  "
                f"{r['in_flight_s']:>24.2f}s  {r['seconds']:>11.1f}  "
                f"{r['samples'] / r['seconds']:>9.2f}"
            )
    two = runs[2]["meta"]
    lines += [
        "",
        "'in flight' runs from a bucket's all-reduce call to its completion, so it includes "
        "waiting for the other process to reach the same bucket",
        f"all-reduce of these gradients alone, both processes ready: {two['flat_s'] * 1000:.0f} ms "
        f"as one buffer, {two['per_tensor_s'] * 1000:.0f} ms as {meta['lora_tensors']} "
        "per-tensor calls",
        f"once, when DDP wraps the UNet: {wrap / 2**30:.2f} GiB broadcast from rank 0 "
        "(every weight, frozen ones included)",
        "a hand-written per-tensor all-reduce at each optimizer step would issue one collective "
        f"per trained tensor: {counts['unet']} per step for this UNet LoRA, "
        f"{counts['unet'] + counts['text_encoder']} with the text-encoder LoRA "
        f"({counts['text_encoder']} text-encoder tensors), each blocking, none overlapped",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latent", type=int, default=16, help="latent side (pixels / 8)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = rank)")
    parser.add_argument("--steps", type=int, default=2, help="measured optimizer steps")
    parser.add_argument("--accumulations", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--port", type=int, default=29640)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs = {n: launch(n, args, Path(tmp) / f"{n}.json") for n in (1, 2)}
    print(report(args, runs))


if __name__ == "__main__":
    main()
