"""Reference images and video clips against the model, before any weight is read: a
text-to-image model is never given reference images it would ignore, an edit model always gets
as many as it takes, and an image model is never given a video dataset.

The model's family is known from a cheap look at its files (its registry entry's ``claims``),
and how many references it takes is its entry's data (FamilyEntry.reference_images), so both checks run
while the plan is made, in --dry_run too: the config's keys before the images are scanned, each
image's count after.
"""

from __future__ import annotations

from pathlib import Path

from library.config.schema import Config
from library.errors import ConfigError
from library.models.families.edit_variant import takes_references
from library.models.families.family_choice import entry_for
from library.models.families.family_entry import FamilyEntry
from library.models.families.registry import families
from library.sampling.generate import check_frame_count


def _edit_models() -> str:
    """ "an edit model (<the registered families that train with reference images>)"."""
    names = [entry.models for entry in families() if entry.reference_images[1] != 0]
    return f"an edit model ({', '.join(names)})" if names else "an edit model"


def _edit_files_of(entry: FamilyEntry, model_path: str) -> str | None:
    """For a transformer file of ``entry``'s that may be an edit model's (FLUX.1 Kontext's file
    is FLUX.1's, told apart only by the config): the setting of each such edit family, in
    words; None for a folder (its model_index.json says what it is) or no such family."""
    if Path(model_path).expanduser().is_dir():
        return None
    hints = [
        f"if it is {other.a_models} model, set {other.file_setting} in [flow]"
        for other in families()
        if other.claims_within == entry.name and other.file_setting
        and other.reference_images[1] != 0
    ]  # fmt: skip
    return "; ".join(hints) or None


def check_reference_config(config: Config) -> None:
    """ConfigError for a subset whose reference images the model cannot take: a
    control_directory for a text-to-image model, none for an edit model (a metadata file may
    name references itself, which the count check sees), or a control_count_per_image above
    what the model takes."""
    entry = entry_for(config.model, config.flow)
    low, high = entry.reference_images
    for d, dataset in enumerate(config.datasets):
        for j, subset in enumerate(dataset.subsets):
            key = f"datasets[{d}].subsets[{j}]"
            if subset.control_directory is not None and high == 0:
                path = config.model.pretrained_model_name_or_path
                edit_hint = _edit_files_of(entry, path)
                if edit_hint:
                    raise ConfigError(
                        f"{key}.control_directory: {path} is read as {entry.a_models} model, "
                        f"which learns from images alone; {edit_hint}; else remove "
                        "control_directory"
                    )
                raise ConfigError(
                    f"{key}.control_directory: {entry.a_models} model learns from images alone, "
                    f"not from reference images; remove control_directory, or train "
                    f"{_edit_models()}"
                )
            wanted = subset.control_count_per_image
            if wanted is not None and high and wanted > high:
                raise ConfigError(
                    f"{key}.control_count_per_image = {wanted}: {entry.a_models} model takes "
                    f"{entry.references_text()} per image; set control_count_per_image = "
                    f"{high} (or remove it)"
                )
            if low and subset.control_directory is None and subset.metadata_file is None:
                raise ConfigError(
                    f"{key} ({subset.image_dir}) has no reference images, and {entry.a_models} "
                    f"model learns each image with {entry.references_text()}; set "
                    "control_directory to the folder that holds them"
                )


def _video_models() -> str:
    """ "a video model (<the registered families that train on clips>)"."""
    names = [entry.models for entry in families() if entry.family().TRAINS_CLIPS]
    return f"a video model ({', '.join(names)})" if names else "a video model"


def check_clip_config(config: Config) -> float:
    """ConfigError for a video subset (video_directory, video_jsonl_file) given to a family
    that trains on images alone (ModelFamily.TRAINS_CLIPS); else the frame rate the family's
    clips are cut for (ModelFamily.FRAME_RATE)."""
    entry = entry_for(config.model, config.flow)
    family = entry.family_of(config.model, config.flow)
    if family.TRAINS_CLIPS:
        return family.FRAME_RATE
    for d, dataset in enumerate(config.datasets):
        for j, subset in enumerate(dataset.subsets):
            if subset.is_video:
                key = "video_directory" if subset.video_directory else "video_jsonl_file"
                raise ConfigError(
                    f"datasets[{d}].subsets[{j}].{key} = {subset.source}: {entry.a_models} "
                    f"model learns from images, not video clips; remove the video dataset, or "
                    f"train {_video_models()}"
                )
    return family.FRAME_RATE


def check_sample_frames(config: Config, prompts) -> None:
    """ConfigError for a sample prompt asking an image model for several frames (--f), before
    any weight is read (library.sampling.generate.check_frame_count)."""
    entry = entry_for(config.model, config.flow)
    family = entry.family_of(config.model, config.flow)
    for prompt in prompts:
        check_frame_count(family, prompt, entry.label)


def check_reference_counts(config: Config, data) -> None:
    """ConfigError for an image with more or fewer references than the model takes (``data``:
    the scanned TrainData)."""
    entry = entry_for(config.model, config.flow)
    for scanned in data.scanned:
        for image in scanned.images + scanned.validation:
            count = len(image.references)
            if not takes_references(entry.reference_images, count):
                fix = (
                    "remove its reference images"
                    if entry.reference_images[1] == 0
                    else f"give it {entry.references_text()} (control_count_per_image takes "
                    "the first ones)"
                )
                raise ConfigError(
                    f"image {image.item.path} has {count} reference images, and "
                    f"{entry.a_models} model takes {entry.references_text()}; {fix}"
                )
