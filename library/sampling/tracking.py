"""Send sample images to the run's experiment trackers (tensorboard, wandb)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from library.sampling.prompts import SamplePrompt


def image_tag(index: int) -> str:
    """The tracker tag of prompt ``index``: one image series per prompt across steps."""
    return f"sample/{index:02d}"


def log_sample_images(
    accelerator, samples: list[tuple[SamplePrompt, Image.Image]], step: int
) -> None:
    """Log each image under ``sample/<index>`` at ``step``; trackers other than tensorboard and
    wandb are left alone. Call on the main process (accelerate keeps trackers only there)."""
    for tracker in getattr(accelerator, "trackers", []):
        if tracker.name == "tensorboard":
            writer = tracker.tracker
            for prompt, image in samples:
                array = np.asarray(image.convert("RGB"))
                writer.add_image(image_tag(prompt.index), array, step, dataformats="HWC")
            writer.flush()
        elif tracker.name == "wandb":
            import wandb

            values = {
                image_tag(p.index): wandb.Image(image, caption=p.prompt) for p, image in samples
            }
            tracker.tracker.log(values, step=step)
