"""Send a small Python value from the main process to every process."""

from __future__ import annotations


def from_main(accelerator, value: object) -> object:
    """``value`` as the main process has it, on every process. A collective: every process
    must call it at the same point (the others wait here until the main process sends)."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box, from_process=0)
    return box[0]
