"""The dataset part of the config, in kohya's dataset schema ([[datasets]] / [[datasets.subsets]]).

These models hold *resolved* values: the loader has already applied kohya's precedence
(subset > dataset > [general] > flat args > default), so every field here is final.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def parse_resolution(value: object) -> list[int]:
    """Normalise 512, [768, 512] or "768,512" to [width, height]; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected 512, [768, 512] or \"768,512\"")
    if isinstance(value, int):
        size = [value, value]
    elif isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() for p in parts) or len(parts) not in (1, 2):
            raise ValueError(f'expected "512" or "768,512", got "{value}"')
        size = [int(p) for p in parts] * (2 if len(parts) == 1 else 1)
    elif isinstance(value, (list, tuple)) and len(value) in (1, 2) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        size = list(value) * (2 if len(value) == 1 else 1)
    else:
        raise ValueError("expected 512, [768, 512] or \"768,512\"")
    if any(v < 64 or v % 8 for v in size):
        raise ValueError(f"each side must be a multiple of 8 and at least 64, got {size}")
    return size


class SubsetConfig(_Strict):
    """One folder of images."""

    image_dir: str = Field(description="Folder of images with optional sidecar caption files.")
    class_tokens: str | None = Field(
        None, description="Caption of images without a caption file."
    )
    caption_extension: str = Field(".txt", description="Extension of sidecar caption files.")
    num_repeats: int = Field(1, ge=1, description="Times each image is seen per epoch.")
    is_reg: bool = Field(False, description="Regularisation (class) images.")


class DatasetConfig(_Strict):
    """Images trained at one resolution and batch size."""

    batch_size: int = Field(1, ge=1, description="Micro-batch size per process.")
    resolution: list[int] = Field(
        default_factory=lambda: [512, 512], description="[width, height] of training images."
    )
    subsets: list[SubsetConfig] = Field(min_length=1, description="Image folders.")

    @field_validator("resolution", mode="before")
    @classmethod
    def _resolution(cls, value: object) -> list[int]:
        return parse_resolution(value)
