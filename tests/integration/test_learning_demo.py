"""The quickstart teaches the pretrained example model a concept, and these tests measure it.

examples/tiny-shapes/ draws its vocabulary: red, green, blue and yellow circles, squares,
triangles and stars on white. The quickstart (configs/quickstart.toml) trains a LoRA on
examples/shapes-concept/: eight magenta stars captioned "a sks shape" (a colour the model never
saw) and regularisation images of its vocabulary. Equivalence tests compare difftune with itself
and with references; these compare what comes out with the training images, so a training
that runs but does not learn (a wrong loss target, noise schedule, learning rate or LoRA scale)
fails here even when every equivalence test passes; checked with the epsilon target's sign
flipped. They also fail for an example model that does not draw its vocabulary.

Every statistic is computed from pixels, independent of any model:
- ``share``: of the foreground (the pixels far from the white background), the fraction near
  a colour;
- ``solidity``: the largest foreground blob's area over its convex hull's: about 0.95 for
  circles and squares, 0.85-0.9 for triangles, 0.6-0.75 for the five-pointed stars;
- ``fill``: the blob's area over its bounding box's: about 0.95 for a square, 0.78 for a circle,
  0.55 for a triangle or a star;
- the blob's centre x, for "on the left" / "on the right".
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.test_quickstart import REPO

MODEL = REPO / "examples" / "tiny-shapes"
CONCEPT_IMAGES = REPO / "examples" / "shapes-concept" / "train" / "10_sks shape"
CONCEPT_PROMPT = "a sks shape"
MAGENTA = (200, 40, 200)
COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
          "yellow": (240, 200, 30)}  # fmt: skip

BACKGROUND_DISTANCE = 60  # RGB distance from white beyond which a pixel is foreground
COLOR_DISTANCE = 80  # RGB distance within which a pixel has a colour (the colours are >150 apart)
SAMPLER, STEPS, SCALE = "ddim", 20, 4.0  # as configs/quickstart.toml samples
SEEDS = range(1, 9)


# --- statistics ------------------------------------------------------------------------------


def _rgb(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float32)


def foreground(image) -> np.ndarray:
    return np.linalg.norm(_rgb(image) - 255.0, axis=-1) > BACKGROUND_DISTANCE


def share(image, color) -> float:
    """The fraction of the foreground within COLOR_DISTANCE of ``color`` (0 without one)."""
    fg = foreground(image)
    near = np.linalg.norm(_rgb(image) - np.asarray(color, np.float32), axis=-1) < COLOR_DISTANCE
    return float((near & fg).sum() / fg.sum()) if fg.any() else 0.0


def largest_blob(image) -> np.ndarray:
    from scipy import ndimage

    labels, count = ndimage.label(foreground(image))
    if count == 0:
        return np.zeros(labels.shape, dtype=bool)
    sizes = ndimage.sum_labels(np.ones_like(labels), labels, index=range(1, count + 1))
    return labels == 1 + int(np.argmax(sizes))


def solidity(image) -> float:
    """Area of the largest blob over the area of the convex hull of its pixels' squares."""
    from scipy.spatial import ConvexHull

    ys, xs = np.nonzero(largest_blob(image))
    if len(xs) < 3:
        return 0.0
    corners = np.concatenate([np.stack([xs + dx, ys + dy], 1) for dx in (0, 1) for dy in (0, 1)])
    return float(len(xs) / ConvexHull(corners).volume)  # a 2-D hull's "volume" is its area


def fill(image) -> float:
    """Area of the largest blob over the area of its bounding box."""
    ys, xs = np.nonzero(largest_blob(image))
    if len(xs) == 0:
        return 0.0
    return float(len(xs) / ((np.ptp(xs) + 1) * (np.ptp(ys) + 1)))


def centre_x(image) -> float:
    ys, xs = np.nonzero(largest_blob(image))
    return float(xs.mean()) if len(xs) else math.nan


def concept_stats(images) -> dict[str, float]:
    """Mean magenta share and mean solidity of ``images``."""
    return {
        "magenta": float(np.mean([share(im, MAGENTA) for im in images])),
        "solidity": float(np.mean([solidity(im) for im in images])),
    }


def distance(stats: dict[str, float], reference: dict[str, float]) -> float:
    """How far ``stats`` are from ``reference``. Solidity counts double: it spans about 0.4
    between a star and a convex shape, the magenta share about 0.9."""
    magenta = abs(stats["magenta"] - reference["magenta"])
    return magenta + 2 * abs(stats["solidity"] - reference["solidity"])


# --- generation ------------------------------------------------------------------------------


def pipeline(lora: Path | None = None):
    """diffusers' StableDiffusionPipeline of the example model (with the LoRA file loaded by
    diffusers' own loader), sampling with difftune's DDIM sampler."""
    from diffusers import StableDiffusionPipeline

    from library.sampling.samplers import build_sampler

    pipe = StableDiffusionPipeline.from_pretrained(
        str(MODEL), safety_checker=None, requires_safety_checker=False
    )
    pipe.scheduler = build_sampler(SAMPLER, pipe.scheduler.config, "epsilon")
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(str(lora))
    return pipe


def generate(pipe, prompt: str, seeds=SEEDS) -> list:
    images = []
    for seed in seeds:
        generator = torch.Generator("cpu").manual_seed(seed)
        result = pipe(prompt, height=64, width=64, num_inference_steps=STEPS,
                      guidance_scale=SCALE, generator=generator)  # fmt: skip
        images.append(result.images[0])
    return images


@pytest.fixture(scope="module")
def base_pipe():
    return pipeline()


@pytest.fixture(scope="module")
def training_stats():
    from PIL import Image

    paths = sorted(CONCEPT_IMAGES.glob("*.png"))
    assert len(paths) == 8
    return concept_stats([Image.open(p) for p in paths])


# --- the example model draws its vocabulary --------------------------------------------------


# (fill range, solidity range) of each shape: a circle fills pi/4 of its box, a square all of it,
# a triangle and a star about half; only the star is far from convex. Observed over 4 seeds x 4
# colours: circles fill 0.75-0.80 (solidity 0.94-0.96), squares 0.88-0.97 (0.92-0.98),
# triangles 0.53-0.61 (0.83-0.92), stars 0.49-0.57 (0.68-0.75).
SHAPE_RANGES = {
    "circle": ((0.70, 0.85), (0.90, 1.0)),
    "square": ((0.85, 1.0), (0.90, 1.0)),
    "triangle": ((0.40, 0.66), (0.79, 1.0)),
    "star": ((0.40, 0.66), (0.50, 0.79)),
}


@pytest.mark.parametrize(
    ("color", "shape"),
    [("red", "circle"), ("blue", "square"), ("green", "triangle"), ("yellow", "star")],
)
def test_example_model_draws_colour_and_shape(base_pipe, color, shape):
    images = generate(base_pipe, f"a {color} {shape}", seeds=range(1, 5))
    shares = [round(share(im, COLORS[color]), 2) for im in images]
    fills = [round(fill(im), 2) for im in images]
    solid = [round(solidity(im), 2) for im in images]
    report = f"a {color} {shape}: colour shares {shares}, fills {fills}, solidities {solid}"
    # observed shares 0.61-0.85: the anti-aliased rim is foreground but not the colour
    assert min(shares) > 0.5, report
    (fill_low, fill_high), (solid_low, solid_high) = SHAPE_RANGES[shape]
    assert all(fill_low < f <= fill_high for f in fills), report
    assert all(solid_low < s <= solid_high for s in solid), report


def test_example_model_draws_positions(base_pipe):
    """Trained at x = 16, 32 and 48 (+-2); observed centres 14-16 and 48-49."""
    left = [centre_x(im) for im in generate(base_pipe, "a blue circle on the left", range(1, 5))]
    right = [centre_x(im) for im in generate(base_pipe, "a red square on the right", range(1, 5))]
    assert max(left) < 22 and min(right) > 42, (left, right)


def test_example_model_does_not_know_the_concept(base_pipe):
    """It draws its own colours for "a sks shape" (observed: no magenta pixel in 8 seeds)."""
    base = concept_stats(generate(base_pipe, CONCEPT_PROMPT))
    assert base["magenta"] < 0.1, base


# --- the quickstart teaches it ---------------------------------------------------------------


@pytest.fixture(scope="module")
def quickstart(quickstart_output):
    return quickstart_output


def test_quickstart_samples_show_the_concept_learned(quickstart, training_stats):
    """The sample images the quickstart writes before the first step and at the end: prompts
    0-2 are "a sks shape", 3-5 "a red circle", "a green triangle", "a blue square"."""
    from PIL import Image

    folder = quickstart / "sample"
    steps = sorted({p.name.split("_")[1] for p in folder.glob("quickstart_*_grid.png")})
    assert steps[0] == "000000" and len(steps) > 1, steps

    def samples(step: str, indices):
        return [Image.open(next(folder.glob(f"quickstart_{step}_{i:02d}_*.png"))) for i in indices]

    before, after = samples(steps[0], range(3)), samples(steps[-1], range(3))
    _assert_learned(concept_stats(before), concept_stats(after), training_stats)
    for i, color in zip(range(3, 6), ("red", "green", "blue"), strict=True):
        kept = [
            share(im, COLORS[color]) for im in (*samples(steps[0], [i]), *samples(steps[-1], [i]))
        ]
        assert min(kept) > 0.7, f"{color} before and after training: {kept}"


def test_saved_lora_draws_the_concept_and_keeps_the_vocabulary(
    quickstart, base_pipe, training_stats
):
    """The saved LoRA file, loaded by diffusers, against the example model: same seeds."""
    lora = pipeline(quickstart / "quickstart.safetensors")
    before = concept_stats(generate(base_pipe, CONCEPT_PROMPT))
    _assert_learned(before, concept_stats(generate(lora, CONCEPT_PROMPT)), training_stats)
    kept = [share(im, COLORS["red"]) for im in generate(lora, "a red circle", range(1, 5))]
    assert min(kept) > 0.7, f"'a red circle' with the LoRA: red shares {kept}"


# Observed (this machine): training images magenta 0.89, solidity 0.60.
#   quickstart samples, seeds 1-3:  step 0 magenta 0.00, solidity 0.87, distance 1.43;
#                                    step 800 magenta 0.71, solidity 0.72, distance 0.42
#   diffusers, seeds 1-8:            base magenta 0.00, solidity 0.89, distance 1.48;
#                                    with the LoRA magenta 0.69, solidity 0.73, distance 0.46
# The margin (0.5) is half the observed gain (~1.0); the generated magenta is a little bluer
# than the training colour and has anti-aliased rims, hence shares of 0.7, not 0.9.
def _assert_learned(before: dict, after: dict, training: dict) -> None:
    report = f"base {before}, with the LoRA {after}, training images {training}"
    assert distance(after, training) < distance(before, training) - 0.5, report
    assert after["magenta"] > 0.5 and after["solidity"] < 0.8, report


# --- the committed example is what its script draws ------------------------------------------


def test_committed_concept_images_and_tokenizer_match_the_generator(tmp_path):
    """The parts tools/make_pretrained_example.py makes without training (the concept's images
    and captions, the tokenizer) are what it draws now. The trained weights take 7-13 minutes
    to remake; examples/README.md says how."""
    from transformers import CLIPTokenizer

    from tools import make_pretrained_example as make

    fresh = tmp_path / "concept"
    make.write_concept(fresh, make.SEED + make.SEED_OFFSETS["concept"])
    committed = CONCEPT_IMAGES.parents[1]  # examples/shapes-concept

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert files(committed) == files(fresh), "examples/shapes-concept drifted from its script"
    drawn = CLIPTokenizer.from_pretrained(str(make.write_tokenizer(tmp_path / "tokenizer")))
    shipped = CLIPTokenizer.from_pretrained(str(MODEL / "tokenizer"))
    assert shipped.get_vocab() == drawn.get_vocab()
    prompts = make.all_captions() + [CONCEPT_PROMPT]
    assert shipped(prompts).input_ids == drawn(prompts).input_ids
    assert len(shipped.tokenize("a red circle on the left")) == 6  # a word is a token
