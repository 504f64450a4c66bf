"""The [sampling] section: sample images during training (kohya's sample_* keys, plus defaults)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from library.config.dataset_schema import MAX_IMAGE_SIDE
from library.config.section import Section

# kohya's sampler names; the k_ names are aliases of the plain ones (library/sampling/samplers.py).
SamplerName = Literal[
    "ddim",
    "pndm",
    "lms",
    "euler",
    "euler_a",
    "heun",
    "dpm_2",
    "dpm_2_a",
    "dpmsolver",
    "dpmsolver++",
    "dpmsingle",
    "k_lms",
    "k_euler",
    "k_euler_a",
    "k_dpm_2",
    "k_dpm_2_a",
]


class SamplingSection(Section):
    """Sample images written to output_dir/sample/ while training (and logged to the tracker)."""

    sample_prompts: str | None = Field(
        None,
        description="Prompts file: .txt (one prompt per line with --n --w --h --d --s --l --ss "
        "options, and --f frames and --i first frame for video models; # comment lines), .toml ([prompt] defaults and [[prompt.subset]] entries) or "
        ".json (a list of prompt objects or lines). Unset: no samples.",
    )
    sample_every_n_steps: int | None = Field(
        None, ge=0, description="Sample every N optimizer steps. Unset or 0: not by steps."
    )
    sample_every_n_epochs: int | None = Field(
        None,
        ge=0,
        description="Sample after every N epochs. Unset or 0: not by epochs. With both cadences "
        "set, a step due by either is sampled once.",
    )
    sample_at_first: bool = Field(
        False, description="Also sample before the first optimizer step (of this run, if resumed)."
    )
    sample_sampler: SamplerName | None = Field(
        None,
        description="Sampler of prompts without --ss (kohya's names). Unset: ddim for SD "
        "models, euler for FLUX.1 and SD3 (flow-matching models sample with Euler only; another "
        "name samples with Euler and a warning, as sd-scripts does).",
    )
    sample_width: int = Field(
        512,
        ge=64,
        le=MAX_IMAGE_SIDE,
        description="Width of prompts without --w; rounded down to a multiple of 8.",
    )
    sample_height: int = Field(
        512,
        ge=64,
        le=MAX_IMAGE_SIDE,
        description="Height of prompts without --h; rounded down to a multiple of 8.",
    )
    sample_steps: int = Field(
        30, ge=1, le=1000, description="Inference steps of prompts without --s."
    )
    sample_scale: float | None = Field(
        None,
        ge=0,
        description="Classifier-free guidance scale of prompts without --l. Unset: 7.5 for SD "
        "and SD3 models, 1 (no CFG; FLUX.1 dev uses its distilled guidance, --g) for FLUX.1.",
    )
    sample_video_format: Literal["webp", "mp4"] = Field(
        "webp",
        description="File of a prompt with several frames (--f, video models): webp (an "
        "animated WebP, lossless) or mp4 (H.264). Either plays at the model's frame rate, with "
        "a PNG strip of a few frames beside it.",
    )
    sample_seed: int | None = Field(
        None,
        ge=0,
        description="Prompt i without --d uses a seed derived from this and i, the same every "
        "round, so images are comparable across steps. Unset: derived from seed.",
    )
