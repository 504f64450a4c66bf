"""Send a small Python value from the main process to every process.

torch's broadcast_object_list hands gloo tensors that only Python references. When gloo's
worker thread releases such a tensor after Python has, the release needs the GIL; if that
happens while the process group is being torn down (which joins those threads with the GIL
held), the process hangs for ever. The tensors here stay referenced from Python until the
process ends, so a worker thread never has to release them.
"""

from __future__ import annotations

import pickle

import torch

# Every tensor a broadcast used: kept so no gloo thread ever drops the last reference.
_KEPT: list[torch.Tensor] = []


def from_main(accelerator, value: object) -> object:
    """``value`` as the main process has it, on every process. A collective: every process
    must call it at the same point (the others wait here until the main process sends)."""
    if accelerator.num_processes == 1:
        return value
    import torch.distributed as dist

    device = accelerator.device  # NCCL sends only GPU tensors; gloo takes the CPU's
    payload = pickle.dumps(value) if accelerator.is_main_process else b""
    size = torch.tensor([len(payload)], dtype=torch.long, device=device)
    _KEPT.append(size)
    dist.broadcast(size, src=0)
    data = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if accelerator.is_main_process:
        data.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    _KEPT.append(data)
    dist.broadcast(data, src=0)
    return pickle.loads(data.cpu().numpy().tobytes())
