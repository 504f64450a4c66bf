"""Latent-cache throughput: images/s of a first build (every image loaded and encoded) and of a
second build (every entry found on disk and verified, nothing encoded).

    python bench/data_cache.py                               # 8 images at 256 px on the CPU
    python bench/data_cache.py --images 256 --resolution 1024 --device cuda --dtype bfloat16

Not a test and not timed in CI. The VAE is a diffusers AutoencoderKL built from SD 1.5's shipped
config (library/models/configs/sd15/vae.json) with random weights under a fixed seed: the
encoder's cost does not depend on the weights' values. The images are smooth synthetic JPEGs of
three aspect ratios, 1.25x the resolution, so loading resizes and crops like a real dataset.
Each figure comes from a function, so further measurements (e.g. loader batches/s with and
without caches) can be added beside them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from library.data import content_hash  # noqa: E402
from library.data.content_hash import tensor_digest  # noqa: E402
from library.data.images import load_image_with_sizes  # noqa: E402
from library.data.latent_cache import BuildStats, LatentCache, LatentRequest  # noqa: E402

SD15_VAE = REPO / "library" / "models" / "configs" / "sd15" / "vae.json"
ASPECTS = ((1, 1), (4, 3), (3, 4))  # (width, height) ratios of the synthetic images


def make_images(folder: Path, count: int, resolution: int, seed: int = 0) -> list[Path]:
    """`count` smooth random JPEGs (upsampled noise) of ASPECTS, 1.25x `resolution` on the
    short side."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        aw, ah = ASPECTS[i % len(ASPECTS)]
        short = resolution * 5 // 4
        size = (short * aw // min(aw, ah), short * ah // min(aw, ah))
        coarse = rng.integers(0, 256, (8 * ah, 8 * aw, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)
        paths.append(folder / f"{i:05d}.jpg")
        image.save(paths[-1], quality=90)
    return paths


def bucket_size(path: Path, resolution: int) -> tuple[int, int]:
    """A bucket of about resolution^2 pixels with the image's aspect ratio, in multiples of 64."""
    with Image.open(path) as image:
        width, height = image.size
    scale = resolution / (width * height) ** 0.5
    return max(64, round(width * scale / 64) * 64), max(64, round(height * scale / 64) * 64)


def latent_requests(paths: list[Path], resolution: int, root: Path) -> list[LatentRequest]:
    """One unflipped, center-cropped request per image, at its bucket size."""
    return [LatentRequest(p, bucket_size(p, resolution), None, False, False, root) for p in paths]


def sd_vae(device: str, dtype: torch.dtype, config: Path = SD15_VAE):
    """SD's AutoencoderKL from its config with random weights (seed 0), in eval mode."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL.from_config(AutoencoderKL.load_config(str(config))).to(device)
    if dtype != torch.float32:  # diffusers warns on any .to(dtype), even a no-op one
        vae = vae.to(dtype=dtype)
    return vae.eval()


def vae_encoder(vae, device: str, dtype: torch.dtype):
    """The `encode` a cache build takes: pixels on the CPU to (mean, std) of the posterior."""

    def encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        posterior = vae.encode(pixels.to(device=device, dtype=dtype)).latent_dist
        return posterior.mean, posterior.std

    return encode


def load_for_cache(request: LatentRequest):
    """The `load` a cache build takes, on the project's image reader (center crop, no alpha)."""
    pixels, original, crop = load_image_with_sizes(request.path, request.size)
    return (pixels.flip(-1) if request.flip else pixels), None, original, crop


def timed_build(cache: LatentCache, requests, encode, batch_size: int) -> tuple[float, BuildStats]:
    """Seconds one build takes, and its stats."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    stats = cache.build(requests, encode, load_for_cache, batch_size)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, stats


def bench_latent_cache(args: argparse.Namespace, work: Path) -> None:
    """Print the VAE digest time and images/s of a first and a second (all reused) build."""
    dtype = getattr(torch, args.dtype)
    paths = make_images(work / "images", args.images, args.resolution)
    requests = latent_requests(paths, args.resolution, work / "images")
    sizes = sorted({r.size for r in requests})
    print(f"{len(requests)} images, buckets {sizes}, device {args.device}, {args.dtype}")
    vae = sd_vae(args.device, dtype)
    start = time.perf_counter()
    identity = tensor_digest(vae)
    print(
        f"VAE identity (tensor_digest of {sum(p.numel() for p in vae.parameters()):,} params): "
        f"{time.perf_counter() - start:.2f} s"
    )
    encode = vae_encoder(vae, args.device, dtype)
    to_disk = args.cache == "disk"
    first = LatentCache(identity, dtype, to_disk=to_disk)
    # disk: a new object, as a new run sees the folder; memory: the same object, built again
    second = LatentCache(identity, dtype, to_disk=True) if to_disk else first
    for label, cache in (("first build", first), ("second build", second)):
        content_hash._MEMO.clear()  # each build hashes the images as a fresh process would
        seconds, stats = timed_build(cache, requests, encode, args.vae_batch_size)
        print(
            f"{label:13s} {stats.total / seconds:8.2f} images/s  ({seconds:.2f} s, "
            f"encoded {stats.encoded_here}, reused {stats.reused})"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=8, help="number of synthetic images")
    parser.add_argument("--resolution", type=int, default=256, help="bucket resolution (pixels)")
    parser.add_argument("--vae-batch-size", type=int, default=4, help="images per VAE call")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--cache", default="disk", choices=["disk", "memory"])
    parser.add_argument("--workdir", type=Path, help="folder for images and cache (default: tmp)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    if args.workdir is not None:
        bench_latent_cache(args, args.workdir)
        return
    with tempfile.TemporaryDirectory(prefix="difftune-bench-") as work:
        bench_latent_cache(args, Path(work))


if __name__ == "__main__":
    main()
