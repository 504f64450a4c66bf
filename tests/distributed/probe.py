"""Instrumentation for the distributed tests: watch a real training run from the outside.

A ``Probe`` monkeypatches accelerate, torch and the trainer's module namespace (never library
files) and records, per process:

- which modules ``Accelerator.prepare`` wrapped in DistributedDataParallel, and the world size;
- with fsdp: how much of the denoiser each process holds once it is sharded;
- with fsdp_text_encoder: how much of each text encoder's sharded copy each process holds;
- each sample round, and whether it drew from text states encoded ahead (fsdp_text_encoder);
- with ``hook``: every DDP gradient bucket all-reduce, through a communication hook registered
  on each wrapped module (it does what DDP's built-in reduction does: divide by the world size,
  all-reduce, so results are unchanged; without ``hook`` DDP's own C++ reduction runs);
- every other collective called through ``torch.distributed`` (all-reduce, gathers, broadcasts,
  barriers, and DDP's coalesced buffer broadcast), with the micro-batch during which it ran;
- the learning rate of each parameter group each time an optimizer really steps (a global
  optimizer pre-hook, so it sees the rates used, not the ones logged);
- each micro-batch loss, and the loss and rates the trainer hands its progress reporter;
- with ``record_grads``: each trained gradient after every backward and (with ``hook``) the
  local gradients each bucket carried into its all-reduce.

It can also send SIGINT to one process right after optimizer step k and its saves, as a user
pressing Ctrl-C on one machine would.
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "_broadcast_coalesced",  # DDP's weight sync at wrap time and its buffer sync before forward
    "reduce_scatter_single",  # FSDP2's gradient reduction (torch 2.13)
    "all_gather_single",  # and its weight gathers
)
_MODULE_NAMES = {"UNet2DConditionModel": "unet", "CLIPTextModel": "text_encoder"}


class Probe:
    """Install with ``with Probe(...) as probe:``; results in ``probe.record`` / ``probe.grads``."""

    def __init__(
        self,
        hook: bool = False,
        record_grads: bool = False,
        interrupt: tuple[int, int] | None = None,
    ):
        self.hook = hook
        self.record_grads = record_grads
        self.interrupt = interrupt  # (optimizer step, rank) after which that rank gets SIGINT
        self.micro = -1  # the micro-batch whose forward or backward runs (0-based, whole run)
        self.in_hook = False
        self.names: dict[int, str] = {}  # id(param) -> "<module>.<param path>"
        self.ddp: list = []
        self.record: dict = {
            "ddp": [],
            "hooks": [],
            "collectives": [],
            "optimizer_lrs": [],
            "micro_losses": [],
            "reported": [],
            "sharded": None,
            "text_sharded": [],
            "sample_rounds": [],
        }
        self.grads: list[dict[str, torch.Tensor]] = []  # after each backward
        self.bucket_inputs: list[tuple[int, dict[str, torch.Tensor]]] = []  # (micro, local grads)
        self._undo: list = []

    # -- installing -------------------------------------------------------------------------

    def _patch(self, owner, name: str, wrapper) -> None:
        original = getattr(owner, name)
        setattr(owner, name, wrapper(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> Probe:
        import accelerate
        import torch.distributed as dist

        import library.sampling.runner as runner_module
        import library.training.caching as caching_module
        import library.training.trainer as trainer_module
        from library.training.progress import ProgressReporter
        from library.training.saver import Saver

        self._patch(accelerate.Accelerator, "prepare", self._wrap_prepare)
        self._patch(accelerate.Accelerator, "backward", self._wrap_backward)
        for op in _COLLECTIVES:
            self._patch(dist, op, self._wrap_collective(op))
        self._patch(trainer_module, "micro_batch_loss", self._wrap_loss)
        self._patch(trainer_module, "shard_trained_denoiser", self._wrap_shard)
        self._patch(caching_module, "sharded_text_encoders", self._wrap_text_shard)
        self._patch(runner_module, "sample_images", self._wrap_samples)
        self._patch(ProgressReporter, "step", self._wrap_report)
        if self.interrupt is not None:
            self._patch(Saver, "after_step", self._wrap_after_step)
        handle = register_optimizer_step_pre_hook(self._on_optimizer_step)
        self._undo.append(handle.remove)
        return self

    def __exit__(self, *exc) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    # -- wrappers ---------------------------------------------------------------------------

    def _wrap_prepare(self, original):
        probe = self

        def prepare(accelerator, *args, **kwargs):
            result = original(accelerator, *args, **kwargs)
            for obj in result if isinstance(result, tuple) else (result,):
                if isinstance(obj, torch.nn.parallel.DistributedDataParallel):
                    probe._watch(obj)
            return result

        return prepare

    def _watch(self, ddp) -> None:
        self.record["world_size"] = ddp.process_group.size()  # the group DDP reduces over
        name = _MODULE_NAMES.get(type(ddp.module).__name__, type(ddp.module).__name__)
        trained = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad]
        for path, param in trained:
            self.names[id(param)] = f"{name}.{path}"
        self.ddp.append((name, ddp))
        self.record["ddp"].append(
            {
                "module": name,
                "trained_tensors": len(trained),
                "trained_numel": sum(p.numel() for _, p in trained),
                "buffers": len(list(ddp.module.buffers())),
            }
        )
        if self.hook:
            ddp.register_comm_hook(name, self._hook)

    def _hook(self, module_name: str, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        buffer = bucket.buffer()
        self.record["hooks"].append(
            {
                "module": module_name,
                "micro": self.micro,
                "bucket": bucket.index(),
                "numel": buffer.numel(),
                "bytes": buffer.numel() * buffer.element_size(),
                "tensors": len(bucket.parameters()),
            }
        )
        if self.record_grads:
            local = {
                self.names[id(p)]: g.detach().clone()
                for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)
            }
            self.bucket_inputs.append((self.micro, local))
        self.in_hook = True
        try:
            return allreduce_hook(None, bucket)  # DDP's own reduction: divide, then all-reduce
        finally:
            self.in_hook = False

    def _wrap_backward(self, original):
        probe = self

        def backward(accelerator, loss, **kwargs):
            out = original(accelerator, loss, **kwargs)
            if probe.record_grads:
                probe.grads.append(probe._trained_grads())
            return out

        return backward

    def _trained_grads(self) -> dict[str, torch.Tensor]:
        grads = {}
        for _, ddp in self.ddp:
            for param in ddp.module.parameters():
                if param.requires_grad and param.grad is not None:
                    grads[self.names[id(param)]] = param.grad.detach().clone()
        return grads

    def _wrap_collective(self, op: str):
        probe = self

        def wrap(original):
            def collective(*args, **kwargs):
                if not probe.in_hook:  # the hook's own all-reduce is counted as a bucket
                    probe.record["collectives"].append({"op": op, "micro": probe.micro})
                return original(*args, **kwargs)

            return collective

        return wrap

    def _wrap_loss(self, original):
        probe = self

        def micro_batch_loss(inputs, batch):
            probe.micro += 1
            loss = original(inputs, batch)
            probe.record["micro_losses"].append(
                {
                    "micro": probe.micro,
                    "loss": loss.item(),
                    "positions": batch["positions"].tolist(),
                }
            )
            return loss

        return micro_batch_loss

    def _wrap_shard(self, original):
        probe = self

        def shard(parts, *args, **kwargs):
            original(parts, *args, **kwargs)
            probe.record["sharded"] = _held(parts.components.denoiser)

        return shard

    def _wrap_text_shard(self, original):
        probe = self

        @contextmanager
        def shard(encoders, *args, **kwargs):
            with original(encoders, *args, **kwargs) as copies:
                probe.record["text_sharded"] = [_held(copy) for copy in copies]
                yield copies

        return shard

    def _wrap_samples(self, original):
        probe = self

        def sample_images(*args, **kwargs):
            ahead = kwargs.get("texts") is not None
            probe.record["sample_rounds"].append({"step": kwargs["step"], "texts_ahead": ahead})
            return original(*args, **kwargs)

        return sample_images

    def _wrap_report(self, original):
        probe = self

        def step(reporter, global_step, loss, lrs, *args, **kwargs):
            probe.record["reported"].append({"step": global_step, "loss": loss, "lrs": list(lrs)})
            return original(reporter, global_step, loss, lrs, *args, **kwargs)

        return step

    def _wrap_after_step(self, original):
        probe = self

        def after_step(saver, global_step):
            original(saver, global_step)
            step, rank = probe.interrupt
            if global_step == step and int(os.environ.get("RANK", "0")) == rank:
                os.kill(os.getpid(), signal.SIGINT)

        return after_step

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.record["optimizer_lrs"].append([group["lr"] for group in optimizer.param_groups])

    # -- results ----------------------------------------------------------------------------

    def dump(self, folder: Path, rank: int) -> None:
        """Write ``rank{rank}.json`` (and ``rank{rank}.pt`` with gradients) into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        for entry, (_, ddp) in zip(self.record["ddp"], self.ddp, strict=True):
            # DDP's own account of its buckets (sizes in bytes, after any rebuild)
            entry["bucket_sizes"] = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
        (folder / f"rank{rank}.json").write_text(
            json.dumps(self.record, indent=1), encoding="utf-8"
        )
        if self.record_grads:
            torch.save(
                {"grads": self.grads, "bucket_inputs": self.bucket_inputs},
                folder / f"rank{rank}.pt",
            )


def _held(module: torch.nn.Module) -> dict:
    """How many of ``module``'s parameters are sharded, and how much of them this process holds."""
    from torch.distributed.tensor import DTensor

    params = list(module.parameters())
    local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    return {
        "tensors": len(params),
        "dtensors": sum(isinstance(p, DTensor) for p in params),
        "numel": sum(p.numel() for p in params),
        "local_numel": sum(t.numel() for t in local),
    }


def probe_from_env() -> tuple[Probe, Path | None]:
    """A probe configured by DIFFTUNE_PROBE_* variables (see launch.py)."""
    interrupt = os.environ.get("DIFFTUNE_PROBE_INTERRUPT")
    probe = Probe(
        hook=os.environ.get("DIFFTUNE_PROBE_HOOK") == "1",
        record_grads=os.environ.get("DIFFTUNE_PROBE_GRADS") == "1",
        interrupt=tuple(int(v) for v in interrupt.split(":")) if interrupt else None,
    )
    folder = os.environ.get("DIFFTUNE_PROBE")
    return probe, Path(folder) if folder else None
