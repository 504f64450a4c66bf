"""Run under torchrun (2 CPU processes): does each optimizer allowed with fsdp step sharded
weights exactly as it steps whole ones? Writes {optimizer: {"difference": the largest weight
difference, "moved": how far the whole weights moved}} as JSON to the path given (rank 0), after 6 steps of a 2-layer model with an odd row count, so one slice
is padded.

    torchrun --nproc_per_node 2 tests/distributed/fsdp_optimizers.py out.json
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from library.config.optimizer_schema import SHARDABLE_OPTIMIZERS, OptimizerSection  # noqa: E402
from library.training.optimizers import build_optimizer, optimizer_train_mode  # noqa: E402

STEPS = 6  # RAdam makes no update before its variance estimate settles (step 6)


def train(model: torch.nn.Module, name: str) -> None:
    """STEPS optimizer steps on inputs every process draws alike (so the mean gradient over
    processes is each one's own)."""
    section = OptimizerSection(optimizer_type=name, learning_rate=1e-2)
    optimizer = build_optimizer(section, [{"params": list(model.parameters()), "lr": 1e-2}])
    optimizer_train_mode(optimizer)
    inputs = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        model(torch.randn(4, 16, generator=inputs)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    result = {}
    for name in SHARDABLE_OPTIMIZERS:
        torch.manual_seed(0)
        whole = torch.nn.Sequential(
            torch.nn.Linear(16, 31), torch.nn.GELU(), torch.nn.Linear(31, 8)
        )
        sharded, start = copy.deepcopy(whole), copy.deepcopy(whole)
        fully_shard(sharded, mesh=mesh)
        train(whole, name)
        train(sharded, name)
        pairs = list(zip(sharded.parameters(), whole.parameters(), start.parameters(), strict=True))
        result[name] = {
            "difference": max((a.full_tensor() - b).abs().max().item() for a, b, _ in pairs),
            "moved": max((b - c).abs().max().item() for _, b, c in pairs),
        }
    if dist.get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps(result), encoding="utf-8")
    dist.barrier()


if __name__ == "__main__":
    main()
    # as train_network.py does (library/cli.py exit_process): tearing down gloo at interpreter
    # exit can abort or hang while its worker threads finish
    sys.stdout.flush()
    os._exit(0)
