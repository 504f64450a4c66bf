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
  is built: training.caching.check_bucket_steps);
- sample image sizes: sd-scripts rounds them down to the model's grid (16 for FLUX.1) and so do
  difftune's pipelines; a size that is rounded gets a warning that says what is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

from library.config.provenance import DEFAULT, provenance
from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.family_choice import entry_for
from library.sampling.pipelines import on_grid


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


def _check_resolution(config: Config, d: int, family: type) -> None:
    dataset, multiple = config.datasets[d], family.PIXEL_MULTIPLE
    width, height = dataset.resolution
    if not (width % multiple or height % multiple):
        return
    widths, heights = nearest_multiples(width, multiple), nearest_multiples(height, multiple)
    if len(widths) == len(heights):  # both sides move together: down, or up
        options = [[w, h] for w, h in zip(widths, heights, strict=True)]
    else:
        options = [[w, h] for w in widths for h in heights]
    key = f"datasets[{d}].resolution"
    written = width if width == height else [width, height]
    raise ConfigError(
        f"{key} = {written}{_where(config, key)} does not fit {family.LABEL}, whose model needs "
        f"image sides that are multiples of {multiple}, and with enable_bucket = false every "
        f"image is trained at exactly that size; use {_sizes_text(options)}"
    )


def _check_bucket_steps(config: Config, d: int, family: type) -> None:
    steps, multiple = config.datasets[d].bucket_reso_steps, family.PIXEL_MULTIPLE
    if steps % multiple == 0:
        return
    key = f"datasets[{d}].bucket_reso_steps"
    use = " or ".join(str(v) for v in nearest_multiples(steps, multiple))
    raise ConfigError(
        f"{key} = {steps}{_where(config, key)} does not fit {family.LABEL}, whose model needs "
        f"image sides that are multiples of {multiple}; use {use}"
    )


def sample_size_notes(prompts: Sequence, family: type) -> list[str]:
    """A warning line for each sample prompt whose size the family's pipeline rounds down."""
    multiple, notes = family.PIXEL_MULTIPLE, []
    for prompt in prompts:
        if prompt.width % multiple or prompt.height % multiple:
            drawn = on_grid(prompt.width, multiple), on_grid(prompt.height, multiple)
            notes.append(
                f"sample prompt {prompt.index + 1} asks for {prompt.width}x{prompt.height}; "
                f"{family.LABEL} draws sides in multiples of {multiple} (as sd-scripts does), "
                f"so it is drawn at {drawn[0]}x{drawn[1]}"
            )
    return notes


def check_image_sizes(config: Config, prompts: Sequence = ()) -> list[str]:
    """ConfigError for a resolution or bucket step the model cannot run (module docstring);
    the warnings about rounded sample sizes. Reads no weight: the model's family is known from
    a look at its files."""
    family = entry_for(config.model, config.flow).family()
    for d, dataset in enumerate(config.datasets):
        if dataset.enable_bucket:
            _check_bucket_steps(config, d, family)
        else:
            _check_resolution(config, d, family)
    return sample_size_notes(prompts, family)
