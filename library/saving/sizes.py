"""Byte counts as messages show them.

A module of its own so that checking the training images while the config loads
(library.data.folders) does not import what library.saving.disk_space needs to estimate a
run's outputs (the memory estimate, the optimizers, the adapters).
"""

from __future__ import annotations


def format_size(count: int) -> str:
    """Bytes for people: GiB with one decimal, smaller amounts in MiB or KiB."""
    if count >= 2**30:
        return f"{count / 2**30:.1f} GiB"
    if count >= 2**20:
        return f"{count / 2**20:.0f} MiB"
    return f"{max(count, 0) / 2**10:.0f} KiB"
