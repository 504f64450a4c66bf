"""Reference images against the model, before any weight is read: a text-to-image model is
never given reference images it would ignore, and an edit model always gets as many as it takes.

The model's family is known from a cheap look at its files (its registry entry's ``claims``),
and how many references it takes is class data (ModelFamily.REFERENCE_IMAGES), so both checks run
while the plan is made, in --dry_run too: the config's keys before the images are scanned, each
image's count after.
"""

from __future__ import annotations

from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.family_choice import entry_for
from library.models.families.registry import families


def _edit_models() -> str:
    """"an edit model (<the registered families that train with reference images>)"."""
    names = [entry.models for entry in families() if entry.family().REFERENCE_IMAGES[1] != 0]
    return f"an edit model ({', '.join(names)})" if names else "an edit model"


def check_reference_config(config: Config) -> None:
    """ConfigError for a subset whose reference images the model cannot take: a
    control_directory for a text-to-image model, or none for an edit model (a metadata file
    may name references itself, which the count check sees)."""
    entry = entry_for(config.model, config.flow)
    family = entry.family()
    low, high = family.REFERENCE_IMAGES
    for d, dataset in enumerate(config.datasets):
        for j, subset in enumerate(dataset.subsets):
            key = f"datasets[{d}].subsets[{j}]"
            if subset.control_directory is not None and high == 0:
                raise ConfigError(
                    f"{key}.control_directory: {entry.a_models} model learns from images alone, "
                    f"not from reference images; remove control_directory, or train "
                    f"{_edit_models()}"
                )
            if low and subset.control_directory is None and subset.metadata_file is None:
                raise ConfigError(
                    f"{key} ({subset.image_dir}) has no reference images, and {entry.a_models} "
                    f"model learns each image with {family.references_text()}; set "
                    "control_directory to the folder that holds them"
                )


def check_reference_counts(config: Config, data) -> None:
    """ConfigError for an image with more or fewer references than the model takes (``data``:
    the scanned TrainData)."""
    entry = entry_for(config.model, config.flow)
    family = entry.family()
    for scanned in data.scanned:
        for image in scanned.images + scanned.validation:
            count = len(image.references)
            if not family.takes_references(count):
                fix = (
                    "remove its reference images"
                    if family.REFERENCE_IMAGES[1] == 0
                    else f"give it {family.references_text()} (control_count_per_image takes "
                    "the first ones)"
                )
                raise ConfigError(
                    f"image {image.item.path} has {count} reference images, and "
                    f"{entry.a_models} model takes {family.references_text()}; {fix}"
                )
