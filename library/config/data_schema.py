"""The flat data keys: where the images are, caching, bad-data handling and validation cadence.

kohya's per-dataset keys (shuffle_caption, enable_bucket, flip_aug, ...) may also be written as
flat keys; they are defaults for every dataset (see library.config.loader), not fields here.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from library.config.dataset_schema import dotted_extension
from library.config.section import Section


class DataSection(Section):
    """kohya's flat dataset arguments; defaults for datasets that do not set them."""

    train_data_dir: str | None = Field(
        None, description='Folder of "<repeats>_<class tokens>" subfolders of training images.'
    )
    reg_data_dir: str | None = Field(
        None, description="Folder of regularisation-image subfolders, same layout."
    )
    in_json: str | None = Field(
        None,
        description="kohya's fine-tuning metadata file (JSON of image -> caption/tags) for the "
        "images in train_data_dir, instead of sidecar caption files.",
    )
    dataset_repeats: int = Field(1, ge=1, description="Repeats of the in_json images per epoch.")
    dataset_config: str | None = Field(
        None, description="A kohya dataset TOML ([general], [[datasets]], [[datasets.subsets]])."
    )
    resolution: int | list[int] | str = Field(
        512,
        description='Training size: 512, [768, 512] or "768,512" (width, height). Without '
        "buckets images are resized to cover it and center-cropped.",
    )
    caption_extension: str = Field(".txt", description="Extension of sidecar caption files.")
    skip_bad_images: bool = Field(
        False,
        description="Leave out images that cannot be read, with a warning and a count (also "
        "one that breaks while the run trains). Default: stop before training, naming the file "
        "(or, for an image that breaks later, after the last whole step, with a state).",
    )
    cache_latents: bool = Field(
        False,
        description="Encode every image with the VAE once before training and keep the latents "
        "in memory. Not with color_aug or random_crop; flip_aug caches both sides.",
    )
    cache_latents_to_disk: bool = Field(
        False,
        description="Also keep the latents on disk, keyed by image content and every setting "
        "that changes them: later runs encode only new or edited images. Implies cache_latents.",
    )
    vae_batch_size: int = Field(1, ge=1, description="Images per VAE call while caching.")
    cache_text_encoder_outputs: bool = Field(
        False,
        description="Keep the text encoders' outputs per final caption text and encode each "
        "caption once (UNet-only training). Works with caption shuffling and dropout: captions "
        "not yet cached are encoded when first met.",
    )
    cache_text_encoder_outputs_to_disk: bool = Field(
        False,
        description="Also keep the text-encoder outputs on disk for later runs. Implies "
        "cache_text_encoder_outputs.",
    )
    cache_dir: str | None = Field(
        None,
        description="Folder of the disk caches and of the scan index (what the last scan read "
        "from the image headers and caption files: a rerun reads only the files that changed). "
        "Unset: a .difftune_cache folder inside each image folder, where the scan index is kept "
        "only with cache_latents_to_disk or cache_text_encoder_outputs_to_disk.",
    )
    validate_every_n_steps: int | None = Field(
        None, ge=1, description="Validation loss every N optimizer steps (needs validation_split)."
    )
    validate_every_n_epochs: int | None = Field(
        None,
        ge=1,
        description="Validation loss every N epochs (needs validation_split). With neither "
        "cadence set, validation runs after every epoch.",
    )
    max_validation_steps: int | None = Field(
        None, ge=1, description="Use at most this many validation batches per process."
    )

    _dotted = field_validator("caption_extension")(dotted_extension)

    @property
    def latents_cached(self) -> bool:
        """Whether latents are cached (in memory at least)."""
        return self.cache_latents or self.cache_latents_to_disk

    @property
    def text_cached(self) -> bool:
        """Whether text-encoder outputs are cached (in memory at least)."""
        return self.cache_text_encoder_outputs or self.cache_text_encoder_outputs_to_disk

    @model_validator(mode="after")
    def _in_json_needs_folder(self) -> DataSection:
        if self.in_json is not None and self.train_data_dir is None:
            raise ValueError("in_json needs train_data_dir, the folder its image names start from")
        if self.in_json is not None and self.reg_data_dir is not None:
            raise ValueError(
                "in_json datasets have no regularisation images; remove reg_data_dir or use a "
                "dataset_config with an is_reg subset"
            )
        return self
