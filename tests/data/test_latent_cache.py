"""The latent cache in one process: what is reused, what is encoded again, what is refused.

Expected latents are computed here directly (the stand-in encoder or the tiny VAE applied to
each image on its own), never taken from the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from library.data.content_hash import file_digest, tensor_digest
from library.data.latent_cache import LatentCache, LatentRequest, cache_file
from library.errors import DataError

SIZE = (24, 16)  # (width, height); multiples of 8 like every bucket


def write_png(path: Path, seed: int, size: tuple[int, int] = (40, 30)) -> Path:
    """A noisy RGB image, different for every seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def load_pixels(request: LatentRequest) -> torch.Tensor:
    """The test's own image pipeline: stretch to the size, [-1, 1], flipped if asked."""
    with Image.open(request.path) as image:
        image = image.convert("RGB").resize(request.size, Image.Resampling.BILINEAR)
    pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 127.5 - 1
    return pixels.flip(-1) if request.flip else pixels


def load(request: LatentRequest):
    """The `load` a build takes: alpha is the red channel mapped to [0, 1]."""
    pixels = load_pixels(request)
    alpha = (pixels[:1] + 1) / 2 if request.with_alpha else None
    return pixels, alpha, (30, 40), (0, 1)


def fake_encode(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic stand-in for the VAE: 8x8 means as 4 latent channels."""
    pooled = F.avg_pool2d(pixels, 8)
    mean = torch.cat([pooled, pooled.mean(1, keepdim=True)], 1)
    return mean, torch.sigmoid(mean)


class Counting:
    """Wraps load and encode, counting the images each one sees."""

    def __init__(self, encode=fake_encode):
        self.encode_fn = encode
        self.loaded: Counter = Counter()
        self.encoded = 0
        self.batch_sizes: list[int] = []

    def load(self, request):
        self.loaded[(request.path.name, request.size, request.flip)] += 1
        return load(request)

    def encode(self, pixels):
        self.encoded += len(pixels)
        self.batch_sizes.append(len(pixels))
        return self.encode_fn(pixels)


def build(cache: LatentCache, requests, batch_size: int = 2) -> tuple:
    counting = Counting()
    stats = cache.build(requests, counting.encode, counting.load, batch_size)
    return stats, counting


def requests_for(paths, root: Path, size=SIZE, flip=False, alpha=False) -> list[LatentRequest]:
    return [LatentRequest(Path(p), size, None, flip, alpha, root) for p in paths]


@pytest.fixture
def images(tmp_path):
    return [write_png(tmp_path / "imgs" / f"{i}.png", seed=i) for i in range(3)]


def expected_mean(request: LatentRequest) -> torch.Tensor:
    return fake_encode(load_pixels(request)[None])[0][0]


def test_second_build_reuses_everything(images, tmp_path):
    requests = requests_for(images, tmp_path)
    stats, counting = build(LatentCache("vae", torch.float32, to_disk=True), requests)
    assert (stats.encoded_here, stats.reused, stats.total) == (3, 0, 3)
    assert counting.encoded == 3 and max(counting.batch_sizes) <= 2
    assert len(list((tmp_path / "latents").glob("*.safetensors"))) == 3

    again = LatentCache("vae", torch.float32, to_disk=True)
    stats, counting = build(again, requests)
    assert (stats.encoded_here, stats.reused, stats.total) == (0, 3, 3)
    assert counting.encoded == 0 and not counting.loaded
    assert len(again) == 3
    for request in requests:
        entry = again.get(request)
        torch.testing.assert_close(entry.mean, expected_mean(request))
        torch.testing.assert_close(entry.std, torch.sigmoid(expected_mean(request)))
        assert entry.original_size == (30, 40) and entry.crop_top_left == (0, 1)
        assert entry.alpha is None


def test_edited_image_reencodes_only_it(images, tmp_path):
    requests = requests_for(images, tmp_path)
    build(LatentCache("vae", torch.float32, to_disk=True), requests)
    before = os.stat(images[1]).st_mtime_ns
    write_png(images[1], seed=99)
    # An edit moves the mtime; force it in case this runs within one clock tick of the write.
    os.utime(images[1], ns=(before + 10**9, before + 10**9))
    cache = LatentCache("vae", torch.float32, to_disk=True)
    stats, counting = build(cache, requests)
    assert stats.encoded_here == 1 and stats.reused == 2
    assert set(counting.loaded) == {("1.png", SIZE, False)}
    torch.testing.assert_close(cache.get(requests[1]).mean, expected_mean(requests[1]))


@pytest.mark.parametrize(
    "changed",
    [
        {"size": (16, 16)},
        {"vae": "other-vae"},
        {"dtype": torch.float16},
    ],
)
def test_other_size_vae_or_dtype_encodes_everything_again(images, tmp_path, changed):
    build(LatentCache("vae", torch.float32, to_disk=True), requests_for(images, tmp_path))
    cache = LatentCache(changed.get("vae", "vae"), changed.get("dtype", torch.float32), True)
    requests = requests_for(images, tmp_path, size=changed.get("size", SIZE))
    stats, counting = build(cache, requests)
    assert stats.encoded_here == 3 and stats.reused == 0 and counting.encoded == 3
    assert cache.get(requests[0]).mean.dtype == changed.get("dtype", torch.float32)


def test_flipped_and_unflipped_are_two_entries(images, tmp_path):
    plain = requests_for(images[:1], tmp_path)[0]
    flipped = requests_for(images[:1], tmp_path, flip=True)[0]
    cache = LatentCache("vae", torch.float32, to_disk=False)
    stats, _ = build(cache, [plain, flipped, plain])
    assert stats.total == 2 and len(cache) == 2
    assert cache.key(plain) != cache.key(flipped)
    torch.testing.assert_close(cache.get(flipped).mean, expected_mean(flipped))
    assert not torch.equal(cache.get(flipped).mean, cache.get(plain).mean)


def test_same_bytes_anywhere_are_one_entry_written_to_every_root(images, tmp_path):
    copy = tmp_path / "elsewhere" / "copy.png"
    copy.parent.mkdir()
    copy.write_bytes(images[0].read_bytes())
    first = requests_for(images[:1], tmp_path / "a")[0]
    second = requests_for([copy], tmp_path / "b")[0]
    cache = LatentCache("vae", torch.float32, to_disk=True)
    assert cache.key(first) == cache.key(second)
    stats, counting = build(cache, [first, second])
    assert stats.total == 1 and counting.encoded == 1
    for request in (first, second):
        assert cache_file(request.root, cache.key(request)).exists()
        torch.testing.assert_close(cache.get(request).mean, expected_mean(first))


def test_key_covers_crop_and_alpha_but_not_path(images, tmp_path):
    cache = LatentCache("vae", torch.float32, to_disk=False)
    base = LatentRequest(images[0], SIZE, None, False, False, tmp_path)
    variants = [
        LatentRequest(images[0], SIZE, (0.5, 0.5), False, False, tmp_path),
        LatentRequest(images[0], SIZE, (0.25, 0.5), False, False, tmp_path),
        LatentRequest(images[0], SIZE, None, False, True, tmp_path),
    ]
    keys = {cache.key(r) for r in [base, *variants]}
    assert len(keys) == 4
    assert cache.key(LatentRequest(images[0], SIZE, None, False, False, tmp_path / "x")) in keys


def test_file_renamed_to_another_key_is_never_returned(images, tmp_path):
    first, second = requests_for(images[:2], tmp_path)
    cache = LatentCache("vae", torch.float32, to_disk=True)
    build(cache, [first, second])
    os.replace(cache_file(tmp_path, cache.key(first)), cache_file(tmp_path, cache.key(second)))

    fresh = LatentCache("vae", torch.float32, to_disk=True)
    with pytest.raises(DataError, match="not made for .*delete the folder"):
        fresh.get(second)
    stats, counting = build(fresh, [first, second])
    assert stats.encoded_here == 2 and counting.encoded == 2
    torch.testing.assert_close(fresh.get(second).mean, expected_mean(second))


def _rewrite_metadata(file: Path, change) -> None:
    with safe_open(str(file), framework="pt") as handle:
        meta = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    change(meta)
    save_file(tensors, str(file), meta)


def test_tampered_metadata_is_refused_and_reencoded(images, tmp_path):
    requests = requests_for(images, tmp_path)
    cache = LatentCache("vae", torch.float32, to_disk=True)
    build(cache, requests)
    file = cache_file(tmp_path, cache.key(requests[2]))
    parts_key = next(k for k in safe_open(str(file), "pt").metadata() if "parts" in k)

    def claim_flipped(meta):
        parts = json.loads(meta[parts_key])
        meta[parts_key] = json.dumps({**parts, "flip": True}, sort_keys=True)

    _rewrite_metadata(file, claim_flipped)
    fresh = LatentCache("vae", torch.float32, to_disk=True)
    with pytest.raises(DataError, match="not made for"):
        fresh.get(requests[2])
    stats, counting = build(fresh, requests)
    assert stats.encoded_here == 1 and set(counting.loaded) == {("2.png", SIZE, False)}
    torch.testing.assert_close(fresh.get(requests[2]).mean, expected_mean(requests[2]))


def test_truncated_file_is_refused_and_reencoded(images, tmp_path):
    requests = requests_for(images, tmp_path)
    cache = LatentCache("vae", torch.float32, to_disk=True)
    build(cache, requests)
    file = cache_file(tmp_path, cache.key(requests[0]))
    with open(file, "r+b") as handle:
        handle.truncate(file.stat().st_size - 7)
    fresh = LatentCache("vae", torch.float32, to_disk=True)
    with pytest.raises(DataError, match="cannot be read"):
        fresh.get(requests[0])
    stats, counting = build(fresh, requests)
    assert stats.encoded_here == 1 and set(counting.loaded) == {("0.png", SIZE, False)}
    torch.testing.assert_close(fresh.get(requests[0]).mean, expected_mean(requests[0]))


def test_missing_entries_fail_clearly(images, tmp_path):
    request = requests_for(images[:1], tmp_path)[0]
    with pytest.raises(DataError, match="missing"):
        LatentCache("vae", torch.float32, to_disk=True).get(request)
    with pytest.raises(KeyError):
        LatentCache("vae", torch.float32, to_disk=False).get(request)


def tiny_vae():
    from diffusers import AutoencoderKL

    from tests.kits.sd.tiny import tiny_vae_config

    torch.manual_seed(0)
    return AutoencoderKL(**tiny_vae_config()).eval()


@pytest.mark.parametrize(("dtype", "to_disk"), [(torch.float32, False), (torch.float16, True)])
def test_cache_equals_direct_vae_encodes(images, tmp_path, dtype, to_disk):
    vae = tiny_vae()

    def encode(pixels):
        posterior = vae.encode(pixels).latent_dist
        return posterior.mean, posterior.std

    requests = [
        *requests_for(images, tmp_path, size=(32, 32), alpha=True),
        *requests_for(images, tmp_path, size=(48, 32), flip=True),
    ]
    counting = Counting(encode)
    cache = LatentCache(tensor_digest(vae), dtype, to_disk=to_disk)
    stats = cache.build(requests, counting.encode, counting.load, batch_size=2, progress=True)
    assert stats.encoded_here == 6 and counting.batch_sizes == [2, 1, 2, 1]
    for request in requests:
        with torch.no_grad():
            posterior = vae.encode(load_pixels(request)[None]).latent_dist
        entry = cache.get(request)
        assert entry.mean.dtype == dtype and entry.mean.device.type == "cpu"
        assert entry.mean.is_contiguous() and entry.std.is_contiguous()
        # a batched encode differs from a single one in the last float32 bits, which can flip
        # one rounding to float16: allow one float16 step there
        atol = 1e-5 if dtype == torch.float32 else 1e-3
        torch.testing.assert_close(entry.mean, posterior.mean[0].to(dtype), atol=atol, rtol=1e-4)
        torch.testing.assert_close(entry.std, posterior.std[0].to(dtype), atol=atol, rtol=1e-4)
        if request.with_alpha:
            torch.testing.assert_close(entry.alpha, (load_pixels(request)[:1] + 1) / 2)


def test_file_digest_is_blake2b_of_the_bytes(images):
    data = images[0].read_bytes()
    assert file_digest(images[0]) == hashlib.blake2b(data, digest_size=16).hexdigest()
    assert file_digest(images[0]) != file_digest(images[1])
    with pytest.raises(DataError, match="gone.png"):
        file_digest(images[0].parent / "gone.png")


def test_tensor_digest_follows_values_not_order():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = module.state_dict()
    reordered = dict(reversed(list(state.items())))
    assert tensor_digest(module) == tensor_digest(state) == tensor_digest(reordered)
    changed = {**state, "0.bias": state["0.bias"].clone()}
    changed["0.bias"][2] += 1e-6
    assert tensor_digest(changed) != tensor_digest(state)
    assert tensor_digest({k: v.double() for k, v in state.items()}) != tensor_digest(state)
    renamed = {("x" + k if k == "0.bias" else k): v for k, v in state.items()}
    assert tensor_digest(renamed) != tensor_digest(state)
