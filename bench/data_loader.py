"""Data-loader throughput: batches/s of TrainData's loader loading images, and with latent caches.

    python bench/data_loader.py                          # 64 images, 512 px buckets, 0 workers
    python bench/data_loader.py --images 512 --workers 4 --batch-size 4
    python bench/data_loader.py --images 16 --workers 2 --epochs 20   # one loader vs one per epoch

Not a test and not timed in CI. Three sources of the same epoch (bucketed, flip_aug on):
- pixels: every sample's image file is decoded, resized, cropped and flipped (what training
  does without a cache; the VAE then encodes the batch on the device, not counted here);
- memory cache: latents from the in-memory cache;
- disk cache: latents read from the cache files.
The caches are built with a stand-in encoder (8x8 average pooling to 4 channels), so building
them is fast; the loader reads tensors of the true latent shape. bench/data_cache.py measures
building with a real VAE.
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

import torch  # noqa: E402

from bench.data_cache import make_images  # noqa: E402
from library.config.dataset_schema import DatasetConfig, SubsetConfig  # noqa: E402
from library.data.dataset import TrainData  # noqa: E402
from library.data.latent_cache import LatentCache  # noqa: E402
from library.data.samples import (  # noqa: E402
    SampleSource,
    latent_requests,
    load_for_cache,  # noqa: E402
)


def stand_in_encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent-shaped (mean, std) from 8x8 average pooling; cheap, for building caches fast."""
    pooled = torch.nn.functional.avg_pool2d(pixels, 8)
    mean = torch.cat([pooled, pooled[:, :1]], dim=1)
    return mean, torch.ones_like(mean)


def make_data(folder: Path, args: argparse.Namespace) -> TrainData:
    subset = SubsetConfig(image_dir=str(folder), class_tokens="bench image", flip_aug=True)
    config = DatasetConfig(
        batch_size=args.batch_size,
        resolution=args.resolution,
        enable_bucket=True,
        min_bucket_reso=args.resolution // 2,
        max_bucket_reso=args.resolution * 2,
        subsets=[subset],
    )
    return TrainData([config], seed=0, cache_dir=str(folder.parent / "cache"))


def batches_per_second(
    data: TrainData, source: SampleSource | None, workers: int, epochs: int = 1, one: bool = True
) -> tuple[float, int]:
    """(batches/s, batches) of ``epochs`` full epochs of rank 0's batches: from one loader
    (``one``, what the trainer does) or from a new loader per epoch (what it did before, so
    workers started again at every epoch)."""
    start = time.perf_counter()
    if one:
        loaders = [data.loader(0, 0, num_workers=workers, source=source, epochs=epochs)]
    else:
        loaders = (data.loader(e, 0, num_workers=workers, source=source) for e in range(epochs))
    count = sum(1 for loader in loaders for _ in loader)
    return count / (time.perf_counter() - start), count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0, help="data-loader worker processes")
    parser.add_argument(
        "--epochs", type=int, default=1,
        help="epochs per measurement; above 1 also measures a new loader per epoch",
    )  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory(prefix="difftune-bench-") as work:
        folder = Path(work) / "images"
        make_images(folder, args.images, args.resolution)
        data = make_data(folder, args)
        requests = latent_requests(data)
        memory = LatentCache("stand-in", torch.float32, to_disk=False)
        memory.build(requests, stand_in_encode, load_for_cache, batch_size=8)
        disk = LatentCache("stand-in", torch.float32, to_disk=True)
        disk.build(requests, stand_in_encode, load_for_cache, batch_size=8)
        print(
            f"{args.images} images, {len(data.groups)} buckets, batch {args.batch_size}, "
            f"{args.workers} workers, {torch.get_num_threads()} threads"
        )
        for label, source in (
            ("pixels", None),
            ("memory cache", SampleSource(memory)),
            ("disk cache", SampleSource(LatentCache("stand-in", torch.float32, to_disk=True))),
        ):
            rate, count = batches_per_second(data, source, args.workers, args.epochs)
            line = f"{label:13s} {rate:9.1f} batches/s  ({count} batches)"
            if args.epochs > 1:
                per_epoch, _ = batches_per_second(data, source, args.workers, args.epochs, False)
                line += f"; a loader per epoch {per_epoch:9.1f} batches/s ({rate / per_epoch:.2f}x)"
            print(line)


if __name__ == "__main__":
    main()
