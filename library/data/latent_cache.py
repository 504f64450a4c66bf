"""The latent cache: the VAE posterior of every training image at its bucket size, crop and flip,
held in memory or in safetensors files beside the images.

Decisions:
- The posterior's mean and std are stored, not a sample. The training step draws
  mean + std * eps with its own keyed eps, so a cached run trains exactly like an uncached one.
- An entry is known by a key over the image's bytes (not its path), the bucket size, crop, flip,
  alpha, the VAE's weights, the cache dtype and FORMAT_VERSION. Entries made under other settings
  are never used: their key differs, and each file's metadata repeats the key's parts, checked on
  every read, so a renamed or edited file is refused rather than returned.
- Each file also holds a checksum of its tensors (content_hash.tensor_digest: every tensor's
  name, dtype, shape and bytes). A full read recomputes it and refuses NaN or Inf values, so
  scaled, overwritten or truncated tensors are never trained on.
- The build reads every file's header and, spread over the ranks, every file's tensors, before
  deciding what is missing: a damaged entry is then missing like an absent one, re-encoded and
  rewritten by the build (one warning per file, from the rank that re-encodes it), never first
  met in training. `get` refuses a file that is damaged later with a DataError.
- Building is sharded: every rank lists the same missing entries in the same order and encodes
  every world_size-th one. A disk cache then holds each entry once; a memory cache sends every
  rank's entries to all ranks, in rounds, over the CacheGroup.
- Images are loaded by a pool of LOAD_THREADS threads one batch ahead of the encoder (PIL's
  decoding and resizing and torch's kernels release the GIL), so at most two batches of pixels
  are in memory. Disk writes run on the same pool, behind the loads they were queued after.
- A disk cache holds nothing in memory: `get` reads and verifies the file each time, which keeps
  memory flat for large datasets and lets data-loader workers read in parallel.
- The key of every request the build saw is kept, so `get` never reads the image again: an image
  deleted or edited while the run trains keeps training from the entry made at the start (the
  next build re-encodes an edited image).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from library.data.cache_group import CacheGroup, gather_in_rounds, gather_or_raise
from library.data.content_hash import all_finite, file_digest, tensor_digest, tensors_damage
from library.errors import DataError
from library.saving.atomic import atomic_write_file

log = logging.getLogger(__name__)

# Bump when the image pipeline (loading, resizing, encoding) or the file's contents change, so
# older files are not found. 2: files hold a checksum of their tensors.
FORMAT_VERSION = 2
LOAD_THREADS = 4
# the setting to change when a cache folder is full or not writable (SaveError's hint)
CACHE_PLACE = "cache folder (cache_dir, or the dataset's cache_directory)"
_PARTS = "difftune.latent_key_parts"
_CHECKSUM = "difftune.latent_checksum"


@dataclass(frozen=True)
class LatentRequest:
    """One image as training sees it; `root/"latents"` is its disk cache folder."""

    path: Path
    size: tuple[int, int]  # (width, height) of the bucket
    crop_fraction: tuple[float, float] | None  # None = center crop
    flip: bool
    with_alpha: bool
    root: Path
    frames: tuple[int, ...] = ()  # a clip's frames in the video at path (library.data.clips)
    # the clip's first frame followed by zeros (an image-to-video condition), not the clip
    first_frame: bool = False

    @property
    def pixel_shape(self) -> tuple[int, ...]:
        """The shape of its loaded pixels: [3, H, W], or [3, F, H, W] for a clip."""
        width, height = self.size
        return (3, *((len(self.frames),) if self.frames else ()), height, width)


@dataclass(frozen=True)
class CachedLatent:
    """The VAE posterior of one request and what SDXL's size conditioning needs (CPU tensors)."""

    mean: torch.Tensor  # one image's posterior mean ([C, h, w] for an image VAE), cache dtype
    std: torch.Tensor
    alpha: torch.Tensor | None  # [1, H, W] pixel-space mask in [0, 1] when with_alpha
    original_size: tuple[int, int]  # (h, w)
    crop_top_left: tuple[int, int]


@dataclass(frozen=True)
class BuildStats:
    """What one build did on this rank: entries it encoded, entries found valid, unique entries,
    and entries whose file was damaged and that were therefore encoded again (on any rank)."""

    encoded_here: int
    reused: int
    total: int
    damaged: int = 0


Loaded = tuple[torch.Tensor, torch.Tensor | None, tuple[int, int], tuple[int, int]]
Load = Callable[[LatentRequest], Loaded]
Encode = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Job:
    """One unique key of a build: its first request and every disk folder that needs it."""

    request: LatentRequest
    parts: str
    roots: list[Path] = field(default_factory=list)


def cache_file(root: Path, key: str) -> Path:
    """The disk cache file of `key` under a request's root."""
    return Path(root) / "latents" / f"{key}.safetensors"


def _expected_names(with_alpha: bool) -> set[str]:
    return {"mean", "std", "alpha"} if with_alpha else {"mean", "std"}


class _Unusable(Exception):
    """A cache file that exists but cannot be used. `kind` is "unreadable", "foreign" (made for
    other settings) or "damaged"; `reason` says what is wrong, for a message."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class LatentCache:
    """Latents of one VAE in one dtype, in memory or (to_disk) in files under each request's
    root; see the module docstring. ``sample_dims``: dimensions of one entry's mean and std
    (3 for an image VAE's [C, h, w]; a video VAE's [C, F, h, w] has 4)."""

    def __init__(
        self, vae_identity: str, dtype: torch.dtype, to_disk: bool, sample_dims: int = 3
    ) -> None:
        self.vae_identity = vae_identity
        self.dtype = dtype
        self.to_disk = to_disk
        self.sample_dims = sample_dims
        self._memory: dict[str, CachedLatent] = {}
        self._on_disk: set[str] = set()
        self._built: dict[LatentRequest, str] = {}  # the key parts of every request built

    def _parts(self, request: LatentRequest) -> str:
        crop = request.crop_fraction
        parts = {
            "format": FORMAT_VERSION,
            "digest": file_digest(request.path),
            "size": [int(request.size[0]), int(request.size[1])],
            "crop": None if crop is None else [float(crop[0]), float(crop[1])],
            "flip": bool(request.flip),
            "alpha": bool(request.with_alpha),
            "vae": self.vae_identity,
            "dtype": str(self.dtype),
        }
        if request.frames:  # a clip; an image's key stays what it was
            parts["frames"] = [int(frame) for frame in request.frames]
        if request.first_frame:
            parts["first_frame"] = True
        return json.dumps(parts, sort_keys=True)

    def key(self, request: LatentRequest) -> str:
        """Hex digest of the image's content digest, size, crop_fraction, flip, with_alpha, the
        VAE identity, the cache dtype and FORMAT_VERSION, and a clip's frames (and whether it
        is the clip's first-frame condition)."""
        return _key_of(self._parts(request))

    def __len__(self) -> int:
        """Entries this cache serves without encoding (held in memory or verified on disk)."""
        return len(self._memory.keys() | self._on_disk)

    def get(self, request: LatentRequest) -> CachedLatent:
        """The entry of `request`: from memory, else (to_disk) read from its file and verified.

        Raises DataError if the file is missing, unreadable, made for something else or damaged
        (checksum mismatch, NaN or Inf, wrong shapes), and KeyError for a memory cache that was
        not built for this request.
        """
        parts = self._built.get(request) or self._parts(request)
        key = _key_of(parts)
        entry = self._memory.get(key)
        if entry is not None:
            return entry
        if not self.to_disk:
            raise KeyError(f"no cached latent for {request.path} at {request.size}; build first")
        return _get_from_disk(
            cache_file(request.root, key), parts, request, self.dtype, self.sample_dims
        )

    def build(
        self,
        requests: Sequence[LatentRequest],
        encode: Encode,
        load: Load,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        group: CacheGroup | None = None,
        progress: bool = False,
    ) -> BuildStats:
        """Encode every request not yet cached; this rank encodes its share of them.

        `requests` must be the same list in the same order on every rank. `load(request)` gives
        (pixels [3, H, W] in [-1, 1], alpha [1, H, W] or None, original (h, w), crop (top,
        left)); `encode(pixels [B, 3, H, W] on the CPU)` gives (mean, std), B entries of
        `sample_dims` dimensions each ([B, C, h, w] for an image VAE), and is called under
        torch.no_grad() with batches of one size. With several processes `group` defaults to a
        new CacheGroup (a collective); if any rank fails, all raise.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if group is None:
            group = CacheGroup.single() if world_size == 1 else CacheGroup()
        if (group.rank, group.world_size) != (rank, world_size):
            raise ValueError(f"group is rank {group.rank} of {group.world_size}, not {rank}")
        pool = ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="latent-cache")
        try:
            return self._build(requests, encode, load, batch_size, group, pool, progress)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _build(self, requests, encode, load, batch_size, group, pool, progress) -> BuildStats:
        jobs: dict[str, _Job] = {}
        mine, error = None, None
        try:
            jobs = self._jobs(requests, pool)
            mine = (_key_of("".join(jobs)), self._faults(jobs, group, pool))
        except Exception as exc:
            error = exc
        gathered = gather_or_raise(group, mine, error, "checking the latent cache")
        if len({fingerprint for fingerprint, _ in gathered}) > 1:
            raise DataError(
                "the training images (or their list) differ between processes; give "
                "every process and machine the same copy of the dataset"
            )
        # The union makes every rank split the same list even if one saw a file another did not
        # (and only one rank read each file's tensors); sorting by size gives each rank an even
        # share of every (differently costly) size.
        faults = _merge_faults(theirs for _, theirs in gathered)
        order = {key: i for i, key in enumerate(jobs)}
        missing = sorted(faults, key=lambda k: (jobs[k].request.pixel_shape, order[k]))
        share = missing[group.rank :: group.world_size]
        encoded, error = {}, None
        try:
            encoded = self._encode_share(share, jobs, encode, load, batch_size, pool, progress)
        except Exception as exc:
            error = exc
        gather_or_raise(group, None, error, "encoding latents")
        for key in share:  # the rank that re-encoded a damaged file is the one that says so
            for file, reason in faults[key].items():
                if reason:
                    log.warning("latent cache entry %s was damaged (%s); re-encoded", file, reason)
        if self.to_disk:
            self._check_visible(missing, jobs, group)
            self._on_disk.update(jobs)
        else:
            self._memory.update(gather_in_rounds(group, list(encoded.items())))
        damaged = sum(1 for files in faults.values() if any(files.values()))
        return BuildStats(len(share), len(jobs) - len(missing), len(jobs), damaged)

    def _jobs(self, requests: Sequence[LatentRequest], pool: ThreadPoolExecutor) -> dict:
        jobs: dict[str, _Job] = {}
        for request, parts in zip(requests, pool.map(self._parts, requests), strict=True):
            self._built[request] = parts
            job = jobs.setdefault(_key_of(parts), _Job(request, parts))
            if request.root not in job.roots:
                job.roots.append(request.root)
        return jobs

    def _faults(self, jobs: dict, group: CacheGroup, pool: ThreadPoolExecutor) -> dict:
        """The keys this rank finds missing, each with its files that need writing and why
        ({file: reason}, reason "" for an absent file; a memory cache has no files).

        Every header is read, and the tensors of every world_size-th entry (from this rank), so
        over all ranks each file is verified once and the build still learns of every damage.
        """
        if not self.to_disk:
            return {key: {} for key in jobs if key not in self._memory}
        items = list(jobs.items())
        verify = [i % group.world_size == group.rank for i in range(len(items))]
        checked = pool.map(self._file_faults, items, verify)
        return {key: files for (key, _), files in zip(items, checked, strict=True) if files}

    def _file_faults(self, item: tuple[str, _Job], verify: bool) -> dict[str, str]:
        key, job = item
        faults = {}
        for root in job.roots:
            file = cache_file(root, key)
            if not file.exists():
                faults[str(file)] = ""
                continue
            try:
                _read_entry(file, job.parts, job.request, self.dtype, self.sample_dims, verify)
            except _Unusable as bad:
                faults[str(file)] = bad.reason
        return faults

    def _encode_share(self, share, jobs, encode, load, batch_size, pool, progress) -> dict:
        encoded: dict[str, CachedLatent] = {}
        writes: list[Future] = []
        batches = _batches([(key, jobs[key]) for key in share], batch_size)
        with tqdm(
            total=len(share), desc="caching latents", unit="img", disable=not progress
        ) as bar:
            for batch, loaded in _prefetched(batches, load, pool):
                entries = self._encode_batch([job for _, job in batch], loaded, encode)
                for (key, job), entry in zip(batch, entries, strict=True):
                    if self.to_disk:
                        writes.append(pool.submit(_write_entry, key, job, entry))
                    else:
                        encoded[key] = entry
                bar.update(len(batch))
            for write in writes:
                write.result()
        return encoded

    def _encode_batch(self, jobs: list[_Job], loaded: list[Loaded], encode: Encode) -> list:
        for job, item in zip(jobs, loaded, strict=True):
            _check_loaded(job.request, item)
        pixels = torch.stack([item[0] for item in loaded])
        with torch.no_grad():
            mean, std = encode(pixels)
        if mean.shape != std.shape or mean.ndim != 1 + self.sample_dims or len(mean) != len(jobs):
            raise ValueError(f"encode gave mean {tuple(mean.shape)}, std {tuple(std.shape)}")
        mean, std = mean.to(self.dtype).cpu(), std.to(self.dtype).cpu()
        if not (all_finite(mean) and all_finite(std)):
            # A stored NaN would be refused as damaged on every read; name the image instead.
            finite = [all_finite(m) and all_finite(s) for m, s in zip(mean, std, strict=True)]
            bad = jobs[finite.index(False)]
            raise DataError(
                f"the VAE gave NaN or Inf latents for {bad.request.path}; in float16 a VAE "
                "can overflow: set no_half_vae = true"
            )
        entries = []
        for i, (_, alpha, original, crop) in enumerate(loaded):
            alpha = None if alpha is None else alpha.detach().cpu().contiguous()
            # A contiguous copy frees each entry from the batch's storage and is what safetensors
            # can save (a VAE's conv output on the CPU is often channels-last strided).
            mean_i = mean[i].clone(memory_format=torch.contiguous_format)
            std_i = std[i].clone(memory_format=torch.contiguous_format)
            entries.append(CachedLatent(mean_i, std_i, alpha, tuple(original), tuple(crop)))
        return entries

    def _check_visible(self, missing: list[str], jobs: dict, group: CacheGroup) -> None:
        """With several ranks, every rank must see the files the others wrote."""
        if group.world_size == 1:
            return
        lacking = [
            cache_file(root, key)
            for key in missing
            for root in jobs[key].roots
            if not cache_file(root, key).exists()
        ]
        counts = gather_or_raise(group, len(lacking), None, "checking the latent cache")
        if any(counts):
            example = lacking[0] if lacking else cache_file(jobs[missing[0]].roots[0], missing[0])
            folder = example.parent
            raise DataError(
                f"latent cache files written by other processes are missing from {folder}; "
                "with several processes or machines, cache_latents_to_disk needs a folder they "
                "all share (or use cache_latents without cache_latents_to_disk)"
            )


def _merge_faults(per_rank) -> dict[str, dict[str, str]]:
    """One {key: {file: reason}} from every rank's: a damage found by any rank wins over a file
    another rank merely did not see or did not verify."""
    merged: dict[str, dict[str, str]] = {}
    for faults in per_rank:
        for key, files in faults.items():
            known = merged.setdefault(key, {})
            for file, reason in files.items():
                if reason or file not in known:
                    known[file] = reason
    return merged


def _key_of(parts: str) -> str:
    return hashlib.blake2b(parts.encode(), digest_size=16).hexdigest()


def _batches(items: list, batch_size: int) -> list[list]:
    """Consecutive runs of one size (and frame count), cut into batches of at most batch_size."""
    batches = []
    for _, run in itertools.groupby(items, key=lambda item: item[1].request.pixel_shape):
        run = list(run)
        batches.extend(run[i : i + batch_size] for i in range(0, len(run), batch_size))
    return batches


def _prefetched(batches: list, load: Load, pool: ThreadPoolExecutor) -> Iterator:
    """(batch, loaded items) in order, loading the next batch while the caller works on one."""
    pending: deque = deque()
    todo = iter(batches)

    def submit() -> None:
        batch = next(todo, None)
        if batch is not None:
            pending.append((batch, [pool.submit(load, job.request) for _, job in batch]))

    submit()
    while pending:
        batch, futures = pending.popleft()
        loaded = [future.result() for future in futures]
        submit()
        yield batch, loaded


def _check_loaded(request: LatentRequest, item: Loaded) -> None:
    pixels, alpha = item[0], item[1]
    width, height = request.size
    if tuple(pixels.shape) != request.pixel_shape:
        raise ValueError(f"load gave {tuple(pixels.shape)} for {request.path} at {request.size}")
    if (alpha is not None) != request.with_alpha:
        raise ValueError(f"load gave alpha={alpha is not None} for {request}")
    if alpha is not None and tuple(alpha.shape) != (1, height, width):
        raise ValueError(f"load gave alpha {tuple(alpha.shape)} for {request.path}")


def _write_entry(key: str, job: _Job, entry: CachedLatent) -> None:
    tensors = {"mean": entry.mean, "std": entry.std}
    if entry.alpha is not None:
        tensors["alpha"] = entry.alpha
    metadata = {
        _PARTS: job.parts,
        _CHECKSUM: tensor_digest(tensors),
        "source_path": str(job.request.path),
        "original_size": json.dumps(list(entry.original_size)),
        "crop_top_left": json.dumps(list(entry.crop_top_left)),
    }
    for root in job.roots:
        path = cache_file(root, key)
        atomic_write_file(path, lambda tmp: save_file(tensors, tmp, metadata), CACHE_PLACE)


def _read_entry(
    file: Path,
    parts: str,
    request: LatentRequest,
    dtype: torch.dtype,
    sample_dims: int,
    verify: bool = True,
) -> CachedLatent | None:
    """The entry in `file` for `request`, checked against the key parts, its checksum, finite
    values and the expected names, dtypes and shapes (means and stds of `sample_dims`
    dimensions); with verify=False only the header is read and checked (safetensors refuses a
    file shorter than its header says) and None returned.

    Raises _Unusable saying what is wrong.
    """
    try:
        with safe_open(str(file), framework="pt") as handle:
            meta = handle.metadata() or {}
            names = set(handle.keys())  # the handle itself is not iterable
            if meta.get(_PARTS) != parts:
                raise _Unusable("foreign", "made for other settings")
            if names != _expected_names(request.with_alpha):
                raise _Unusable("damaged", f"holds tensors {sorted(names)}")
            if not verify:
                return None
            tensors = {name: handle.get_tensor(name) for name in names}
        sizes = [tuple(json.loads(meta[name])) for name in ("original_size", "crop_top_left")]
    except _Unusable:
        raise
    except Exception as error:  # truncated, not safetensors, metadata missing or not JSON
        raise _Unusable("unreadable", f"cannot be read: {error}") from error
    damage = tensors_damage(tensors, meta.get(_CHECKSUM))
    if damage is not None:
        raise _Unusable("damaged", damage)
    mean, std, alpha = tensors["mean"], tensors["std"], tensors.get("alpha")
    width, height = request.size
    if (
        mean.dtype != dtype
        or std.dtype != dtype
        or mean.ndim != sample_dims
        or mean.shape != std.shape
        or (alpha is not None and tuple(alpha.shape) != (1, height, width))
        or any(len(size) != 2 for size in sizes)
    ):
        raise _Unusable("damaged", "wrong shapes or dtypes")
    return CachedLatent(mean, std, alpha, *sizes)


def _get_from_disk(
    file: Path, parts: str, request: LatentRequest, dtype: torch.dtype, sample_dims: int
) -> CachedLatent:
    """The verified entry in `file`; a DataError naming the file and the fix when unusable."""
    fix = f"delete the folder {file.parent} and run again to rebuild the cache"
    if not file.exists():
        raise DataError(f"latent cache file {file} for {request.path} is missing; {fix}")
    try:
        entry = _read_entry(file, parts, request, dtype, sample_dims)
    except _Unusable as bad:
        if bad.kind == "unreadable":
            message = f"latent cache file {file} for {request.path} {bad.reason}; {fix}"
        elif bad.kind == "foreign":
            message = (
                f"latent cache file {file} was not made for {request.path} with these settings "
                f"(renamed or edited); {fix}"
            )
        else:
            message = (
                f"latent cache file {file} for {request.path} is damaged ({bad.reason}), so it "
                "is not trained on; delete it, or run again: the cache build re-encodes damaged "
                "entries"
            )
        raise DataError(message) from bad
    assert entry is not None  # verify=True always returns the entry
    return entry
