"""Image sizes the model cannot run, found before any weight is read.

Every family knows the pixel multiple its model needs (ModelFamily.PIXEL_MULTIPLE: the VAE's 8,
times 2 for the 2x2 patches of FLUX.1's and SD3's transformers), and its loader knows the family
from a cheap look at the model's files. So a size that cannot work is refused while the plan is
made, in --dry_run too, instead of at the first step:

- a dataset's ``resolution`` with buckets off (every image is trained at exactly that size;
  sd-scripts takes it as it is and fails in the first step too): refused, naming the key and
  the nearest sizes that work;
- ``bucket_reso_steps`` with buckets on: bucket sides are its multiples, so it must be one of the
  pixel multiple (the denoiser's own bucket grid, such as SD 1.x's 64, is checked once the model
  is built: training.caching.check_bucket_steps); with buckets off too where a subset keeps its
  reference images' own sizes (no_resize_control), which are rounded to its multiples;
- an edit model's ``control_resolution`` with buckets off: every reference image is resized to
  exactly that size, so it is checked as ``resolution`` is;
- sample image sizes: sd-scripts rounds them down to the model's grid (16 for FLUX.1) and so do
  difftune's pipelines; a size that is rounded gets a warning that says what is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from library.config.provenance import DEFAULT, provenance
from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.family_choice import entry_for
from library.sampling.pipelines import on_grid


class Grid(NamedTuple):
    """The pixel multiple a model needs (its family's PIXEL_MULTIPLE) and its name in messages
    (its registry entry's label: an edit variant's own)."""

    multiple: int
    label: str


def nearest_multiples(value: int, multiple: int) -> list[int]:
    """The multiples of ``multiple`` nearest ``value`` (below and above; one when it is one)."""
    below = value - value % multiple
    if below == value:
        return [value]
    return [below, below + multiple] if below >= multiple else [below + multiple]


def _where(config: Config, key: str) -> str:
    source = provenance(config).source(key)
    return "" if source == DEFAULT else f" (set in {source})"


def _sizes_text(sizes: list[list[int]]) -> str:
    """'992 or 1008' for square sizes, '[992, 512] or [1008, 512]' otherwise."""
    if all(width == height for width, height in sizes):
        return " or ".join(str(width) for width, _ in sizes)
    return " or ".join(f"[{width}, {height}]" for width, height in sizes)


def _check_resolution(config: Config, d: int, grid: Grid) -> None:
    width, height = config.datasets[d].resolution
    _check_size(config, f"datasets[{d}].resolution", (width, height), grid, "image")


def _check_control_resolutions(config: Config, d: int, grid: Grid) -> None:
    for j, subset in enumerate(config.datasets[d].subsets):
        if subset.control_resolution is None or subset.no_resize_control:
            continue  # no_resize_control: the sides are rounded to bucket_reso_steps
        key = _subset_key(config, d, j, "control_resolution")
        width, height = subset.control_resolution
        _check_size(config, key, (width, height), grid, "reference image")


def _subset_key(config: Config, d: int, j: int, name: str) -> str:
    """A subset's key as the user wrote it: musubi-tuner's dataset tables are their own
    subset (``datasets[0].control_resolution``)."""
    nested = f"datasets[{d}].subsets[{j}].{name}"
    alone = f"datasets[{d}].{name}"
    sources = provenance(config)
    return (
        alone if sources.source(nested) == DEFAULT and sources.source(alone) != DEFAULT else nested
    )


def _check_size(config: Config, key: str, size: tuple[int, int], grid: Grid, what: str) -> None:
    """ConfigError when ``size`` at ``key``, the exact size of every ``what`` with buckets off,
    is not on the family's pixel grid."""
    multiple = grid.multiple
    width, height = size
    if not (width % multiple or height % multiple):
        return
    widths, heights = nearest_multiples(width, multiple), nearest_multiples(height, multiple)
    if len(widths) == len(heights):  # both sides move together: down, or up
        options = [[w, h] for w, h in zip(widths, heights, strict=True)]
    else:
        options = [[w, h] for w in widths for h in heights]
    written = width if width == height else [width, height]
    raise ConfigError(
        f"{key} = {written}{_where(config, key)} does not fit {grid.label}, whose model needs "
        f"image sides that are multiples of {multiple}, and with enable_bucket = false every "
        f"{what} is trained at exactly that size; use {_sizes_text(options)}"
    )


def _check_bucket_steps(config: Config, d: int, grid: Grid) -> None:
    steps, multiple = config.datasets[d].bucket_reso_steps, grid.multiple
    if steps % multiple == 0:
        return
    key = f"datasets[{d}].bucket_reso_steps"
    use = " or ".join(str(v) for v in nearest_multiples(steps, multiple))
    raise ConfigError(
        f"{key} = {steps}{_where(config, key)} does not fit {grid.label}, whose model needs "
        f"image sides that are multiples of {multiple}; use {use}"
    )


def sample_size_notes(prompts: Sequence, grid: Grid) -> list[str]:
    """A warning line for each sample prompt whose size the family's pipeline rounds down."""
    multiple, notes = grid.multiple, []
    for prompt in prompts:
        if prompt.width % multiple or prompt.height % multiple:
            drawn = on_grid(prompt.width, multiple), on_grid(prompt.height, multiple)
            notes.append(
                f"sample prompt {prompt.index + 1} asks for {prompt.width}x{prompt.height}; "
                f"{grid.label} draws sides in multiples of {multiple} (as sd-scripts does), "
                f"so it is drawn at {drawn[0]}x{drawn[1]}"
            )
    return notes


def check_image_sizes(config: Config, prompts: Sequence = ()) -> list[str]:
    """ConfigError for a resolution or bucket step the model cannot run (module docstring);
    the warnings about rounded sample sizes. Reads no weight: the model's family is known from
    a look at its files."""
    entry = entry_for(config.model, config.flow)
    grid = Grid(entry.family_of(config.model, config.flow).PIXEL_MULTIPLE, entry.label)
    for d, dataset in enumerate(config.datasets):
        own_sizes = any(subset.no_resize_control for subset in dataset.subsets)
        if dataset.enable_bucket or own_sizes:
            _check_bucket_steps(config, d, grid)
        if not dataset.enable_bucket:
            _check_resolution(config, d, grid)
            _check_control_resolutions(config, d, grid)
    return sample_size_notes(prompts, grid)
