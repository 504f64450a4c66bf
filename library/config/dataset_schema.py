"""The dataset part of the config, in kohya's dataset schema ([[datasets]] / [[datasets.subsets]]).

These models hold *resolved* values: the loader has already applied kohya's precedence
(subset > dataset > [general] > flat args > default), so every field here is final.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Largest image side in pixels (training and sample images): a larger side is a typo such as
# 100000, and would only fail after minutes of loading, when memory runs out.
MAX_IMAGE_SIDE = 8192


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def parse_resolution(value: object) -> list[int]:
    """Normalise 512, [768, 512] or "768,512" to [width, height]; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError('expected 512, [768, 512] or "768,512"')
    if isinstance(value, int):
        size = [value, value]
    elif isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() for p in parts) or len(parts) not in (1, 2):
            raise ValueError(f'expected "512" or "768,512", got "{value}"')
        size = [int(p) for p in parts] * (2 if len(parts) == 1 else 1)
    elif (
        isinstance(value, (list, tuple))
        and len(value) in (1, 2)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        size = list(value) * (2 if len(value) == 1 else 1)
    else:
        raise ValueError('expected 512, [768, 512] or "768,512"')
    if any(v < 64 or v % 8 for v in size):
        raise ValueError(f"each side must be a multiple of 8 and at least 64, got {size}")
    if any(v > MAX_IMAGE_SIDE for v in size):
        raise ValueError(f"each side must be at most {MAX_IMAGE_SIDE}, got {size}")
    return size


Rate = Annotated[float, Field(ge=0.0, le=1.0)]


def dotted_extension(value: str) -> str:
    """kohya reads caption_extension "txt" as ".txt"."""
    return value if value.startswith(".") else f".{value}"


class SubsetConfig(_Strict):
    """One folder of images, or one metadata file listing images and captions."""

    image_dir: str | None = Field(
        None,
        description="Folder of images with optional sidecar caption files. With metadata_file: "
        "the folder its relative image paths start from.",
    )
    metadata_file: str | None = Field(
        None,
        description="Captions from a file instead of sidecar files: kohya's fine-tuning JSON "
        '({"image": {"caption": ..., "tags": ...}}), or a Hugging Face imagefolder '
        "metadata.jsonl / metadata.csv (file_name + text).",
    )
    video_directory: str | None = Field(
        None,
        description="Folder of training videos (mp4, webm, mov, gif, ... and folders of frames) "
        "with optional sidecar caption files (musubi-tuner's word); each video gives the clips "
        "frame_extraction cuts. For the families that train on clips.",
    )
    video_jsonl_file: str | None = Field(
        None,
        description='musubi-tuner\'s video JSONL: one {"video_path": ..., "caption": ...} per '
        "line (paths relative to the file's folder, or absolute).",
    )
    target_frames: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description="Video subsets: the clip lengths cut from each video, each rounded down to "
        "4 N + 1 frames (musubi-tuner's word).",
    )
    frame_extraction: Literal["head", "chunk", "slide", "uniform", "full"] = Field(
        "head",
        description="Video subsets: which clips: head (the first), chunk (back to back), slide "
        "(every frame_stride frames), uniform (frame_sample clips spread evenly), full (the "
        "whole video up to max_frames).",
    )
    frame_stride: int = Field(1, ge=1, description="Video subsets: frames between slide's clips.")
    frame_sample: int = Field(1, ge=1, description="Video subsets: clips per length of uniform.")
    max_frames: int = Field(129, ge=1, description="Video subsets: longest clip of full.")
    source_fps: float | None = Field(
        None,
        gt=0,
        description="Video subsets: the videos' frame rate; frames are dropped to the model's "
        "frame rate (each video family's page says it) before clips are cut. Unset: every frame is kept.",
    )
    class_tokens: str | None = Field(None, description="Caption of images without a caption file.")
    caption_extension: str = Field(".txt", description="Extension of sidecar caption files.")
    num_repeats: int = Field(1, ge=1, description="Times each image is seen per epoch.")
    is_reg: bool = Field(False, description="Regularisation (class) images.")
    alpha_mask: bool = Field(
        False,
        description="Weight the loss by the image's alpha channel (transparent pixels are not "
        "learned); images without alpha count as opaque.",
    )
    shuffle_caption: bool = Field(
        False, description="Shuffle the caption's tags (split on caption_separator) per sample."
    )
    caption_separator: str = Field(",", min_length=1, description="What separates tags.")
    keep_tokens: int = Field(
        0, ge=0, description="The first N tags stay in place (not shuffled or dropped)."
    )
    keep_tokens_separator: str = Field(
        "",
        description='Tags before this mark (e.g. "|||") stay in place; a second mark starts a '
        "fixed tail. Overrides keep_tokens for captions that contain it.",
    )
    secondary_separator: str = Field(
        "",
        description="Joins sub-tags that move and drop as one tag; written as caption_separator "
        "in the trained caption.",
    )
    enable_wildcard: bool = Field(
        False,
        description="{a|b|c} in a caption picks one alternative per sample, and a caption file's "
        "lines are alternatives (one is picked per sample).",
    )
    caption_prefix: str = Field("", description="Text put before every caption, as written.")
    caption_suffix: str = Field("", description="Text put after every caption, as written.")
    caption_dropout_rate: Rate = Field(
        0.0, description="Probability of training a sample with an empty caption."
    )
    caption_dropout_every_n_epochs: int = Field(
        0, ge=0, description="Every N-th epoch trains with empty captions (0: never)."
    )
    caption_tag_dropout_rate: Rate = Field(
        0.0, description="Probability of dropping each (non-fixed) tag."
    )
    token_warmup_min: int = Field(
        1, ge=0, description="Tags kept at step 0 when token_warmup_step is set."
    )
    token_warmup_step: float = Field(
        0.0,
        ge=0.0,
        description="Steps over which the kept tags grow from token_warmup_min to all; below 1, "
        "a fraction of max_train_steps. 0: no warmup.",
    )
    flip_aug: bool = Field(False, description="Flip images horizontally at random (per sample).")
    color_aug: bool = Field(
        False, description="Shift the hue slightly at random (per sample). Not with cache_latents."
    )
    random_crop: bool = Field(
        False,
        description="Crop at a random place instead of the center (per sample). Not with "
        "cache_latents.",
    )

    cache_directory: str | None = Field(
        None,
        description="Folder of this subset's disk caches (latents, text-encoder outputs) and "
        "scan index, instead of cache_dir or a .difftune_cache folder beside the images "
        "(musubi-tuner's word).",
    )
    control_directory: str | None = Field(
        None,
        description="Edit models (the families that learn from reference images): the folder of each image's "
        "reference (control) images, paired by name as musubi-tuner pairs them: for a.png, "
        "a.<any image extension> first, then a_0, a_1, ... in number order. Every image needs "
        "one; with metadata_file, a JSONL's control_path / control_path_<n> fields name them "
        "instead.",
    )
    control_count_per_image: int | None = Field(
        None,
        ge=1,
        description="How many reference images each image takes (the first ones in order); an "
        "image with fewer is an error. Unset: every reference found.",
    )
    no_resize_control: bool = Field(
        False,
        description="Keep each reference image at its own aspect ratio and size (sides rounded "
        "down to multiples of bucket_reso_steps; shrunk only if larger than the dataset's "
        "resolution area, or control_resolution's when both are set) instead of resizing it "
        "to its target's bucket.",
    )
    control_resolution: list[int] | None = Field(
        None,
        description="[width, height] whose area each reference image is resized to at its own "
        "aspect ratio (bucketed like the targets), instead of its target's bucket.",
    )

    _dotted = field_validator("caption_extension")(dotted_extension)

    @field_validator("control_resolution", mode="before")
    @classmethod
    def _control_resolution(cls, value: object) -> list[int] | None:
        return None if value is None else parse_resolution(value)

    @model_validator(mode="after")
    def _source(self) -> SubsetConfig:
        videos = [k for k in ("video_directory", "video_jsonl_file") if getattr(self, k)]
        if len(videos) == 2:
            raise ValueError("a subset takes video_directory or video_jsonl_file, not both")
        if videos and (self.image_dir is not None or self.metadata_file is not None):
            image = "image_dir" if self.image_dir is not None else "metadata_file"
            raise ValueError(
                f"a subset holds images or videos: {image} and {videos[0]} are both set; put "
                "them in two subsets (or two datasets)"
            )
        if not videos and self.image_dir is None and self.metadata_file is None:
            raise ValueError(
                "a subset needs image_dir (a folder of images), metadata_file, video_directory "
                "or video_jsonl_file"
            )
        return self

    @model_validator(mode="after")
    def _video_options(self) -> SubsetConfig:
        if self.is_video:
            for key in ("alpha_mask", "control_directory"):
                if getattr(self, key):
                    raise ValueError(f"{key} is for images; a video subset cannot take it")
        return self

    @property
    def is_video(self) -> bool:
        """Whether the subset's samples are clips cut from videos."""
        return self.video_directory is not None or self.video_jsonl_file is not None

    @property
    def source(self) -> str:
        """The folder or file the subset's images (or videos) come from, for messages."""
        return self.image_dir or self.metadata_file or self.video_directory or self.video_jsonl_file

    @model_validator(mode="after")
    def _references(self) -> SubsetConfig:
        if self.control_directory is None and self.metadata_file is None:
            options = [
                key
                for key in ("control_count_per_image", "control_resolution")
                if getattr(self, key) is not None
            ] + (["no_resize_control"] if self.no_resize_control else [])
            if options:
                raise ValueError(
                    f"{options[0]} sizes or counts reference images, and this subset has none: "
                    "set control_directory or remove it"
                )
        return self


class DatasetConfig(_Strict):
    """Images trained at one resolution and batch size."""

    batch_size: int = Field(1, ge=1, description="Micro-batch size per process.")
    resolution: list[int] = Field(
        default_factory=lambda: [512, 512],
        description="[width, height] of training images; with buckets, its area is the largest "
        "bucket area.",
    )
    enable_bucket: bool = Field(
        False,
        description="Aspect-ratio buckets: each image is trained at the bucket size nearest its "
        "aspect ratio (area up to resolution's); every batch comes from one bucket.",
    )
    min_bucket_reso: int = Field(256, ge=64, le=MAX_IMAGE_SIDE, description="Smallest bucket side.")
    max_bucket_reso: int = Field(1024, ge=64, le=MAX_IMAGE_SIDE, description="Largest bucket side.")
    bucket_reso_steps: int = Field(
        64,
        ge=8,
        description="Bucket sides are multiples of this (64 for SD 1.x/2.x; 32 works for SDXL).",
    )
    bucket_no_upscale: bool = Field(
        False,
        description="Never enlarge an image: small images get a bucket of their own size "
        "(rounded down to bucket_reso_steps).",
    )
    bucketing: Literal["kohya", "musubi"] = Field(
        "kohya",
        description='Whose bucket rule: "kohya" (min_bucket_reso to max_bucket_reso) or '
        "\"musubi\" (musubi-tuner's: buckets from the resolution's area alone). A dataset "
        "written as musubi-tuner writes them (images named in [[datasets]], no subsets) "
        'defaults to "musubi", with musubi-tuner\'s defaults: resolution [960, 544] and '
        "bucket_reso_steps 16.",
    )
    validation_split: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Fraction of the training images held out for the validation loss "
        "(chosen by validation_seed and the file names; the same in every run).",
    )
    validation_seed: int | None = Field(
        None, description="Seed of the validation split and noise. Unset: seed."
    )
    subsets: list[SubsetConfig] = Field(min_length=1, description="Image folders.")

    @field_validator("resolution", mode="before")
    @classmethod
    def _resolution(cls, value: object) -> list[int]:
        return parse_resolution(value)

    @model_validator(mode="after")
    def _buckets(self) -> DatasetConfig:
        if not self.enable_bucket:
            return self
        steps, low, high = self.bucket_reso_steps, self.min_bucket_reso, self.max_bucket_reso
        if steps % 8:
            raise ValueError(f"bucket_reso_steps = {steps} must be a multiple of 8 (use 64)")
        if self.bucketing == "musubi":
            return self  # musubi-tuner's rule has no bucket range
        if low > high:
            raise ValueError(f"min_bucket_reso = {low} is above max_bucket_reso = {high}")
        if any(side < low or side > high for side in self.resolution):
            raise ValueError(
                f"resolution {self.resolution} must lie within min_bucket_reso = {low} and "
                f"max_bucket_reso = {high}"
            )
        return self

    @property
    def held_out(self) -> bool:
        """Whether part of the dataset is kept for validation."""
        return self.validation_split > 0
