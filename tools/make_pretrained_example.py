"""Write the pretrained example: a tiny SD 1.x-layout model that draws coloured shapes, and the
images of a concept it has never seen, for the quickstart to teach it.

    python tools/make_pretrained_example.py        (from the repository root; 7-13 min, one core)

It writes
- ``examples/tiny-shapes/``: a diffusers folder (``model_index.json``, ``unet/``, ``vae/``,
  ``text_encoder/``, ``tokenizer/``, ``scheduler/``) of 7.8 MB that draws 64x64 images of
  its vocabulary: "a red circle on the left", "a blue star", "a yellow square in the middle",
  "a green shape", ... (``COLORS`` x ``SHAPES`` x ``POSITIONS``, each part optional);
- ``examples/shapes-concept/``: the quickstart's images in kohya's DreamBooth layout:
  ``train/10_sks shape/``, eight images of the concept, a magenta star (a colour the model
  never saw), captioned "a sks shape", and ``reg/1_shape/``, sixteen regularisation images of
  the vocabulary with their captions;
- ``docs/images/tiny-shapes-vocabulary.png``: what the model draws for some of its prompts.

How the model is made, on the CPU, single-threaded, under fixed seeds:
1. the tokenizer is CLIP's BPE tokenizer with a word-level vocabulary: every vocabulary word is
   one token (merges build it), any other word falls back to one token per character;
2. the text encoder is a small CLIP text model with random weights drawn under a seed and never
   trained: distinct words give distinct hidden states, which is all the UNet needs;
3. the VAE (AutoencoderKL, 4x downsampling: 64x64x3 images <-> 16x16x4 latents) is trained to
   reconstruct generic flat-shape images (random polygons, stars and ellipses in random colours
   on random backgrounds, and the vocabulary's images), so it also encodes the concept's images;
4. the UNet (UNet2DConditionModel, SD 1.x's block types at a small width) is trained on the
   vocabulary's images with difftune's own DDPM epsilon objective (library.training.objectives)
   and SD's noise schedule, on latents drawn from the VAE's posterior as difftune trains, with
   10% empty captions so classifier-free guidance works.
The result is deterministic for one machine and set of library versions; another CPU or another
torch build may give slightly different weights (floating-point order): the same kind of model.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = ROOT / "examples"
PREVIEW = ROOT / "docs" / "images" / "tiny-shapes-vocabulary.png"
MODEL_NAME = "tiny-shapes"
CONCEPT_NAME = "shapes-concept"
# Training states of a run in progress (removed at its end): a rerun after a stop continues.
STATE_DIR_NAME = ".make_pretrained_example-state"

IMAGE_SIZE = 64
SUPERSAMPLE = 4  # shapes are drawn at 4x and box-filtered down: smooth, deterministic edges
BACKGROUND = (255, 255, 255)

# The vocabulary the model is trained on.
COLORS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 200, 30),
}
SHAPES = ("circle", "square", "triangle", "star")
# caption phrase -> the shape's centre x in pixels (the y centre varies freely)
POSITIONS = {"on the left": 16, "in the middle": 32, "on the right": 48}
CLASS_WORD = "shape"  # stands for any shape in captions ("a red shape")

# The concept the quickstart teaches: a colour the model never saw, on one of its shapes.
CONCEPT_TOKEN = "sks"
CONCEPT_CAPTION = f"a {CONCEPT_TOKEN} {CLASS_WORD}"
CONCEPT_COLOR = (200, 40, 200)  # magenta
CONCEPT_SHAPE = "star"
CONCEPT_IMAGES = 8
CONCEPT_REPEATS = 10

WORDS = (
    ("a", CLASS_WORD)
    + tuple(COLORS)
    + SHAPES
    + tuple(w for phrase in POSITIONS for w in phrase.split())
)

SEED = 0
# What each part draws its randomness from: SEED + its offset.
SEED_OFFSETS = {"concept": 10, "text_encoder": 20, "vae": 30, "data": 40, "unet": 50}
VAE_STEPS = 1500
UNET_STEPS = 3000


# --- drawing ----------------------------------------------------------------------------------


def shape_points(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """Polygon corners of ``shape`` ("square", "triangle" or "star") of size ``r`` (about half
    its width) centred on (cx, cy), in pixels."""
    if shape == "square":
        h = 0.88 * r
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if shape == "triangle":  # equilateral, pointing up, its box centred on (cx, cy)
        big = 1.15 * r
        pts = [(cx + big * math.cos(a), cy + big * math.sin(a)) for a in _angles(3, -90)]
        shift = (max(p[1] for p in pts) + min(p[1] for p in pts)) / 2 - cy
        return [(x, y - shift) for x, y in pts]
    if shape == "star":  # five points, pointing up
        big = 1.2 * r
        pts = []
        for i, a in enumerate(_angles(10, -90)):
            rad = big if i % 2 == 0 else 0.45 * big
            pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
        return pts
    raise ValueError(f"unknown shape {shape!r}")


def _angles(n: int, start_degrees: float) -> list[float]:
    return [math.radians(start_degrees + 360 * i / n) for i in range(n)]


def draw_scene(items, background=BACKGROUND):
    """A 64x64 RGB PIL image of ``items``: (shape, colour, cx, cy, r) tuples, drawn in order.

    ``shape`` is "circle", "square", "triangle", "star", or a list of polygon corners.
    """
    from PIL import Image, ImageDraw

    s = SUPERSAMPLE
    image = Image.new("RGB", (IMAGE_SIZE * s, IMAGE_SIZE * s), tuple(int(c) for c in background))
    draw = ImageDraw.Draw(image)
    for shape, color, cx, cy, r in items:
        color = tuple(int(c) for c in color)
        if shape == "circle":
            draw.ellipse([(cx - r) * s, (cy - r) * s, (cx + r) * s, (cy + r) * s], fill=color)
        else:
            pts = shape if isinstance(shape, list) else shape_points(shape, cx, cy, r)
            draw.polygon([(x * s, y * s) for x, y in pts], fill=color)
    return image.reduce(s)


def vocabulary_item(rng: np.random.Generator, color: str, shape: str, position: str):
    """One drawn item of the vocabulary: its size and exact place vary within the position."""
    r = rng.uniform(10.0, 13.0)
    cx = POSITIONS[position] + rng.uniform(-2.0, 2.0)
    cy = 32 + rng.uniform(-6.0, 6.0)
    return (shape, COLORS[color], cx, cy, r)


def concept_item(rng: np.random.Generator):
    """The concept (a magenta star) at a random place and size, like the vocabulary's shapes."""
    r = rng.uniform(10.0, 13.0)
    cx = rng.uniform(18.0, 46.0)
    cy = 32 + rng.uniform(-6.0, 6.0)
    return (CONCEPT_SHAPE, CONCEPT_COLOR, cx, cy, r)


def caption(color: str | None, shape: str | None, position: str | None) -> str:
    """The caption "a red circle on the left"; a part that is None is left out (a shape is
    then "shape")."""
    words = ["a"] + ([color] if color else []) + [shape or CLASS_WORD]
    return " ".join(words + ([position] if position else []))


def all_captions() -> list[str]:
    """Every caption the UNet is trained on, the empty one (for guidance) first."""
    out = [""]
    for color in (None, *COLORS):
        for shape in (None, *SHAPES):
            for position in (None, *POSITIONS):
                out.append(caption(color, shape, position))
    return out


def random_caption(rng: np.random.Generator, color: str, shape: str, position: str) -> str:
    """A caption of an image: empty 10% of the time (for guidance), else the whole description
    half the time, or with parts left out (each part kept with probability 0.7)."""
    u = rng.random()
    if u < 0.1:
        return ""
    if u < 0.55:
        return caption(color, shape, position)
    keep = rng.random(3) < 0.7
    return caption(color if keep[0] else None, shape if keep[1] else None,
                   position if keep[2] else None)  # fmt: skip


def generic_scene(rng: np.random.Generator):
    """An image for the VAE only: 1-3 random polygons, stars or ellipses in random colours on a
    random (mostly white) background; the VAE must encode any flat-colour image of shapes."""
    background = BACKGROUND if rng.random() < 0.6 else tuple(rng.integers(0, 256, 3))
    items = []
    for _ in range(rng.integers(1, 4)):
        cx, cy = rng.uniform(6, 58, 2)
        r = rng.uniform(4, 18)
        color = tuple(rng.integers(0, 256, 3))
        kind = rng.integers(0, 3)  # 0: circle, 1: regular polygon, 2: star
        if kind == 0:
            items.append(("circle", color, cx, cy, r))
            continue
        n = int(rng.integers(3, 9))
        corners = 2 * n if kind == 2 else n
        turn = rng.uniform(0, 2 * math.pi)
        inner = rng.uniform(0.3, 0.7) if kind == 2 else 1.0
        pts = []
        for i in range(corners):
            rad = r * (inner if i % 2 else 1.0)
            a = turn + 2 * math.pi * i / corners
            pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
        items.append((pts, color, cx, cy, r))
    return draw_scene(items, background)


def vocabulary_dataset(count: int, seed: int):
    """``count`` images of random vocabulary items and their (colour, shape, position) labels."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for _ in range(count):
        c, s, p = _random_labels(rng)
        item = vocabulary_item(rng, list(COLORS)[c], SHAPES[s], list(POSITIONS)[p])
        images.append(draw_scene([item]))
        labels.append((c, s, p))
    return images, np.array(labels)


def _random_labels(rng: np.random.Generator) -> tuple[int, int, int]:
    c = int(rng.integers(len(COLORS)))
    s = int(rng.integers(len(SHAPES)))
    return c, s, int(rng.integers(len(POSITIONS)))


def to_tensor(images) -> torch.Tensor:
    """PIL images -> [N, 3, 64, 64] float32 in [-1, 1]."""
    array = np.stack([np.asarray(im, dtype=np.float32) for im in images])
    return torch.from_numpy(array).permute(0, 3, 1, 2) / 127.5 - 1.0


# --- tokenizer and text encoder --------------------------------------------------------------


def write_tokenizer(folder: Path) -> Path:
    """CLIP tokenizer files with every word of WORDS as one token (and one token per character
    for any other word): vocab.json, merges.txt and the configs."""
    from transformers import CLIPTokenizer

    from tests.kits.sd.tiny import _byte_alphabet, write_clip_tokenizer_files

    folder.mkdir(parents=True, exist_ok=True)
    alphabet = _byte_alphabet()
    base = alphabet + [c + "</w>" for c in alphabet]
    words = list(dict.fromkeys(w for w in WORDS if len(w) > 1))
    chains = {w: _merge_chain(w) for w in words}
    order = list(words)
    broken: list[str] = []
    for _ in range(10 * len(words)):
        merges = [m for w in order for m in chains[w]]
        write_clip_tokenizer_files(folder, base, merges)
        tokenizer = CLIPTokenizer.from_pretrained(str(folder))
        broken = [w for w in order if len(tokenizer.tokenize(w)) != 1]
        if not broken:
            return folder
        # A merge of an earlier word applied inside this one: build this word first.
        order.remove(broken[0])
        order.insert(0, broken[0])
    raise RuntimeError(f"no merge order makes every word one token: {broken}")


def _merge_chain(word: str) -> list[tuple[str, str]]:
    """The merges that build ``word`` + "</w>" from its characters, left to right."""
    chars = list(word[:-1]) + [word[-1] + "</w>"]
    merges, prefix = [], chars[0]
    for c in chars[1:]:
        merges.append((prefix, c))
        prefix += c
    return merges


def build_text_encoder(vocab_size: int, seed: int):
    """A small CLIP text model (SD 1.x's kind: quick-GELU) with random weights under ``seed``."""
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        hidden_act="quick_gelu",
        bos_token_id=vocab_size - 2,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 1,
    )
    model = CLIPTextModel(config)
    with torch.no_grad():
        # CLIP's initial token embeddings (std 0.02) are small next to what the random layers
        # add alike to every position: the hidden states of "a red circle" and "a red star"
        # would be 97% alike. At std 1 every word's state is its own (about orthogonal).
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def encode_captions(tokenizer, text_encoder, captions: list[str]) -> torch.Tensor:
    """[N, 77, 32] hidden states, exactly as difftune conditions SD 1.x (last layer)."""
    from library.models.text import encode_prompts

    return encode_prompts(tokenizer, text_encoder, captions, "cpu")


# --- VAE --------------------------------------------------------------------------------------


def vae_config() -> dict:
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ("DownEncoderBlock2D",) * 3,
        "up_block_types": ("UpDecoderBlock2D",) * 3,
        "block_out_channels": (16, 32, 32),
        "layers_per_block": 1,
        "latent_channels": 4,
        "norm_num_groups": 8,
        "sample_size": IMAGE_SIZE,
        # no attention: the VAE trains on crops, and a convolutional one works at any size
        "mid_block_add_attention": False,
    }


def train_vae(steps: int, seed: int, log=print, kl_weight: float = 1e-5, state_dir=None):
    """The AutoencoderKL, trained on 32x32 crops (it is convolutional) of generic scenes and of
    the vocabulary's images: L1 + MSE reconstruction and a small KL term, which keeps the
    latents near N(0, 1) and the decoder tolerant of small errors in them."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    vae = AutoencoderKL(**vae_config())
    rng = np.random.default_rng(seed)
    pool = [generic_scene(rng) for _ in range(3000)]
    for _ in range(1000):
        c, s, p = _random_labels(rng)
        pool.append(draw_scene([vocabulary_item(rng, list(COLORS)[c], SHAPES[s],
                                                list(POSITIONS)[p])]))  # fmt: skip
    data = to_tensor(pool)
    opt = torch.optim.AdamW(vae.parameters(), lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: _cosine(i, steps, 50))
    batch, crop = 32, 32
    parts = {"model": vae, "opt": opt, "sched": sched, "rng": rng}
    checkpoint = Checkpoint(state_dir, "vae", {"steps": steps, "seed": seed, "kl": kl_weight})
    first = checkpoint.load(parts)
    start = time.process_time()
    for step in range(first, steps):
        checkpoint.save(step, parts)
        idx = torch.from_numpy(rng.integers(0, len(data), batch))
        y0, x0 = (int(v) for v in rng.integers(0, IMAGE_SIZE - crop + 1, 2))
        x = data[idx, :, y0 : y0 + crop, x0 : x0 + crop]
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
        loss = (rec - x).abs().mean() + (rec - x).pow(2).mean() + kl_weight * post.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"vae step {step}: loss {loss.item():.4f} ({time.process_time() - start:.0f}s)")
    return vae.eval().requires_grad_(False)


def _cosine(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


class Checkpoint:
    """Keeps a training loop's whole state in ``folder`` every ``every`` steps, so a run that was
    stopped continues where it was, on exactly the weights an uninterrupted run has (the model,
    optimizer, schedule, EMA and every random state are restored). ``folder`` None: off."""

    def __init__(self, folder: Path | None, name: str, key: dict, every: int = 250):
        self.path = None if folder is None else folder / f"{name}.pt"
        self.key, self.every = key, every

    def load(self, parts: dict) -> int:
        """Restore ``parts`` (a module "model", "opt", "sched", numpy "rng", torch "gen", an
        "ema" dict) if a state of the same run is kept; return the step to start at."""
        if self.path is None or not self.path.exists():
            return 0
        state = torch.load(self.path, weights_only=False)
        if state["key"] != self.key:
            return 0
        parts["model"].load_state_dict(state["model"])
        parts["opt"].load_state_dict(state["opt"])
        parts["sched"].load_state_dict(state["sched"])
        parts["rng"].bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch"])
        if "gen" in parts:
            parts["gen"].set_state(state["gen"])
        if "ema" in parts:
            for k, v in state["ema"].items():
                parts["ema"][k].copy_(v)
        return state["step"]

    def save(self, step: int, parts: dict) -> None:
        """Keep the state before ``step`` when it is due."""
        if self.path is None or step % self.every:
            return
        state = {
            "key": self.key,
            "step": step,
            "model": parts["model"].state_dict(),
            "opt": parts["opt"].state_dict(),
            "sched": parts["sched"].state_dict(),
            "rng": parts["rng"].bit_generator.state,
            "torch": torch.get_rng_state(),
            "gen": parts["gen"].get_state() if "gen" in parts else None,
            "ema": parts.get("ema", {}),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, self.path.with_suffix(".tmp"))
        self.path.with_suffix(".tmp").replace(self.path)


@torch.no_grad()
def encode_latents(vae, images: torch.Tensor, batch: int = 256):
    """Unscaled latent means and standard deviations of ``images``."""
    posts = [vae.encode(images[i : i + batch]).latent_dist for i in range(0, len(images), batch)]
    return torch.cat([p.mean for p in posts]), torch.cat([p.std for p in posts])


# --- UNet -------------------------------------------------------------------------------------


def unet_config() -> dict:
    return {
        "sample_size": IMAGE_SIZE // 4,
        "in_channels": 4,
        "out_channels": 4,
        "layers_per_block": 1,
        "block_out_channels": (32, 64, 64),
        "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        "cross_attention_dim": 32,
        "attention_head_dim": 1,  # diffusers' name for the number of heads here
        "norm_num_groups": 16,
    }


def scheduler_config() -> dict:
    """SD's noise schedule (the tiny random model's), as a DDIM sampler's config."""
    from tests.kits.sd.tiny import tiny_scheduler_config

    return tiny_scheduler_config("sd1")


def train_unet(means, stds, labels, embeddings, steps: int, seed: int, log=print, state_dir=None):
    """The UNet, trained with difftune's DDPM epsilon objective on cached latents.

    ``means`` and ``stds`` [N, 4, 16, 16] are the scaled latent posteriors of the images (each
    step draws latents from them, as difftune does); ``labels`` [N, 3] the (colour, shape,
    position) indices of each image; ``embeddings`` the hidden states of ``all_captions()``.
    Min-SNR-5 loss weights (as ``min_snr_gamma = 5``) and an EMA of the weights, which is what
    is returned.
    """
    from diffusers import DDPMScheduler, UNet2DConditionModel

    from library.training.objectives import DDPMObjective

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**unet_config())
    ema = {k: v.detach().clone() for k, v in unet.state_dict().items()}
    keys = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type")
    ddpm = DDPMScheduler(**{k: scheduler_config()[k] for k in keys})
    objective = DDPMObjective(ddpm, v_prediction=False)
    alphas = ddpm.alphas_cumprod
    index = {c: i for i, c in enumerate(all_captions())}
    colors, positions = list(COLORS), list(POSITIONS)
    rng = np.random.default_rng(seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: _cosine(i, steps, 100))
    batch = 32
    parts = {"model": unet, "opt": opt, "sched": sched, "rng": rng, "gen": gen, "ema": ema}
    checkpoint = Checkpoint(state_dir, "unet", {"steps": steps, "seed": seed})
    first = checkpoint.load(parts)
    start = time.process_time()
    for step in range(first, steps):
        checkpoint.save(step, parts)
        idx = rng.integers(0, len(means), batch)
        caps = [random_caption(rng, colors[c], SHAPES[s], positions[p]) for c, s, p in labels[idx]]
        cond = embeddings[[index[c] for c in caps]]
        pick = torch.from_numpy(idx)
        x0 = means[pick] + stds[pick] * torch.randn(means[pick].shape, generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.randint(0, ddpm.config.num_train_timesteps, (batch,), generator=gen)
        pred = unet(objective.noisy(x0, noise, t), objective.model_time(t), cond).sample
        snr = alphas[t] / (1 - alphas[t])
        weight = torch.clamp(snr, max=5.0) / snr
        per_sample = (pred - objective.target(x0, noise, t)).pow(2).mean(dim=(1, 2, 3))
        loss = (weight * per_sample).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        sched.step()
        decay = min(0.998, (1 + step) / (10 + step))
        with torch.no_grad():
            for k, v in unet.state_dict().items():
                ema[k].mul_(decay).add_(v, alpha=1 - decay)
        if step % 250 == 0 or step == steps - 1:
            log(f"unet step {step}: loss {loss.item():.4f} ({time.process_time() - start:.0f}s)")
    unet.load_state_dict(ema)
    return unet.eval().requires_grad_(False)


# --- writing ----------------------------------------------------------------------------------


def save_model(folder: Path, vae, unet, text_encoder, tokenizer_dir: Path) -> Path:
    """A StableDiffusionPipeline folder, loadable by difftune and diffusers."""
    from diffusers import DDIMScheduler

    from tests.kits.sd.tiny import save_sd_pipeline

    parts = {"vae": vae, "text_encoder": text_encoder, "unet": unet,
             "scheduler": DDIMScheduler(**scheduler_config())}  # fmt: skip
    return save_sd_pipeline(folder, parts, tokenizer_dir)


def write_concept(folder: Path, seed: int) -> list[Path]:
    """The quickstart's images in kohya's DreamBooth layout: the concept's (``train/10_sks
    shape/``, captioned "a sks shape") and regularisation images of the vocabulary
    (``reg/1_shape/``, one of each colour and shape, captioned "a red circle on the left"), which
    keep the LoRA from drawing magenta stars for every prompt. Returns the written files."""
    rng = np.random.default_rng(seed)
    train = folder / "train" / f"{CONCEPT_REPEATS}_{CONCEPT_TOKEN} {CLASS_WORD}"
    train.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(CONCEPT_IMAGES):
        path = train / f"{CONCEPT_TOKEN}_{i:02d}.png"
        draw_scene([concept_item(rng)]).save(path, format="PNG")
        path.with_suffix(".txt").write_text(CONCEPT_CAPTION + "\n", encoding="utf-8")
        written += [path, path.with_suffix(".txt")]
    reg = folder / "reg" / f"1_{CLASS_WORD}"
    reg.mkdir(parents=True, exist_ok=True)
    positions = list(POSITIONS)
    for i, (color, shape) in enumerate((c, s) for c in COLORS for s in SHAPES):
        position = positions[i % len(positions)]
        path = reg / f"{color}_{shape}.png"
        draw_scene([vocabulary_item(rng, color, shape, position)]).save(path, format="PNG")
        path.with_suffix(".txt").write_text(caption(color, shape, position) + "\n", "utf-8")
        written += [path, path.with_suffix(".txt")]
    return written


PREVIEW_PROMPTS = (
    "a red circle on the left",
    "a blue square in the middle",
    "a green triangle on the right",
    "a yellow star",
    "a blue star on the right",
    "a yellow circle in the middle",
    "a red triangle on the left",
    "a green shape",
)


def write_preview(model_dir: Path, path: Path, seeds=(1, 2)) -> Path:
    """A grid of what the model draws for PREVIEW_PROMPTS (a column each, a row per seed),
    sampled as the quickstart samples (difftune's DDIM sampler, 20 steps, guidance scale 4),
    enlarged 2x."""
    from diffusers import StableDiffusionPipeline
    from PIL import Image

    from library.sampling.samplers import build_sampler

    pipe = StableDiffusionPipeline.from_pretrained(
        str(model_dir), safety_checker=None, requires_safety_checker=False
    )
    pipe.scheduler = build_sampler("ddim", pipe.scheduler.config, "epsilon")
    pipe.set_progress_bar_config(disable=True)
    grid = Image.new("RGB", (IMAGE_SIZE * len(PREVIEW_PROMPTS), IMAGE_SIZE * len(seeds)))
    for row, seed in enumerate(seeds):
        for column, prompt in enumerate(PREVIEW_PROMPTS):
            image = pipe(
                prompt, height=IMAGE_SIZE, width=IMAGE_SIZE, num_inference_steps=20,
                guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(seed),
            ).images[0]  # fmt: skip
            grid.paste(image, (IMAGE_SIZE * column, IMAGE_SIZE * row))
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.resize((2 * grid.width, 2 * grid.height), Image.NEAREST).save(path, format="PNG")
    return path


def make_pretrained_example(
    out_dir: Path = EXAMPLES_DIR,
    vae_steps: int = VAE_STEPS,
    unet_steps: int = UNET_STEPS,
    seed: int = SEED,
    log=print,
) -> Path:
    """(Re)write ``out_dir``/tiny-shapes and ``out_dir``/shapes-concept; returns the model."""
    from transformers import CLIPTokenizer

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model_dir, concept_dir = out_dir / MODEL_NAME, out_dir / CONCEPT_NAME
    for folder in (model_dir, concept_dir):
        shutil.rmtree(folder, ignore_errors=True)
    write_concept(concept_dir, seed + SEED_OFFSETS["concept"])
    tokenizer_dir = write_tokenizer(model_dir / "tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(str(tokenizer_dir))
    text_encoder = build_text_encoder(len(tokenizer), seed + SEED_OFFSETS["text_encoder"])
    state_dir = out_dir / STATE_DIR_NAME
    vae = train_vae(vae_steps, seed + SEED_OFFSETS["vae"], log, state_dir=state_dir)
    images, labels = vocabulary_dataset(4096, seed + SEED_OFFSETS["data"])
    means, stds = encode_latents(vae, to_tensor(images))
    spread = (means.var() + stds.pow(2).mean()).sqrt().item()  # of latents drawn from them
    scale = float(f"{1.0 / spread:.4f}")
    vae.register_to_config(scaling_factor=scale)
    log(f"latents: mean {means.mean().item():.3f}, std {spread:.3f} -> scaling_factor {scale}")
    embeddings = encode_captions(tokenizer, text_encoder, all_captions())
    unet = train_unet(
        means * scale,
        stds * scale,
        labels,
        embeddings,
        unet_steps,
        seed + SEED_OFFSETS["unet"],
        log,
        state_dir,
    )
    folder = save_model(model_dir, vae, unet, text_encoder, tokenizer_dir)
    shutil.rmtree(state_dir, ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--out_dir",
        type=Path,
        default=EXAMPLES_DIR,
        help=f"where {MODEL_NAME}/ and {CONCEPT_NAME}/ go (default: examples/)",
    )
    parser.add_argument("--preview", default=str(PREVIEW), help="the preview image; '' for none")
    parser.add_argument(
        "--vae_steps",
        type=int,
        default=VAE_STEPS,
        help="VAE training steps (the default makes the committed model)",
    )
    parser.add_argument("--unet_steps", type=int, default=UNET_STEPS,
                        help="UNet training steps (the default makes the committed model)")  # fmt: skip
    args = parser.parse_args(argv)
    start = time.process_time()
    folder = make_pretrained_example(args.out_dir, args.vae_steps, args.unet_steps)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"wrote {folder} ({size / 1e6:.1f} MB) in {time.process_time() - start:.0f}s CPU")
    if args.preview:
        print(f"wrote {write_preview(folder, Path(args.preview))}")


if __name__ == "__main__":
    # Run as a script, the repository root is not on the import path.
    sys.path.insert(0, str(ROOT))
    from library.third_party_noise import silence_unactionable_messages

    silence_unactionable_messages()  # before diffusers imports bitsandbytes
    main()
