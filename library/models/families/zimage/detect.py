"""Which weights are a Z-Image transformer's, by the block names only it has."""

from __future__ import annotations

from collections.abc import Iterable

# Block names only Z-Image's transformer has, in the original or diffusers layout.
MARKS = ("noise_refiner.", "context_refiner.")


def detect_zimage(keys: Iterable[str]) -> str | None:
    """ "transformer" when the keys are a Z-Image transformer's (refiner blocks), else None."""
    for key in keys:
        plain = key.removeprefix("model.diffusion_model.")
        if plain.startswith(MARKS):
            return "transformer"
    return None
