"""One training or validation sample: its caption, augmentation, pixels or cached latents.

Every random choice of a sample (caption operations, flip, crop, hue) is keyed by (seed, epoch,
position) in library.data.captions / library.data.augment, so a sample is the same whichever
process, micro-batch or data-loader worker builds it.

An image (or its latent cache file) that cannot be read any more while the run trains (deleted,
truncated, overwritten since the scan) does not raise here: a data-loader worker's exception
would end one process alone, and the others would wait for it at the step's collective. The
sample comes out as a stand-in of the same shape with loss weight 0 (it adds nothing to the
gradient, like a padding slot) and the problem in its "unreadable" entry; the trainer agrees
with the other processes at the step's end on what to do (library.training.unreadable).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from library.data.augment import AugmentDraws, draw_augment
from library.data.captions import process_caption
from library.data.clip_frames import ClipFrames
from library.data.clips import fit_clip, load_training_clip
from library.data.content_hash import file_digest
from library.data.groups import ScannedData
from library.data.images import load_training_image
from library.data.items import ScannedImage, SubsetOptions
from library.data.latent_cache import LatentCache, LatentRequest
from library.data.references import ScannedReference
from library.data.schedule import SampleRef, stable_seed
from library.errors import DataError
from library.models.latent_codec import LatentLayout
from library.models.video_latent_codec import first_frame_pixels

_NO_AUGMENT = AugmentDraws(flip=False, crop_fraction=None, hue_shift=0.0)


@dataclass(frozen=True)
class SampleSource:
    """What samples need beyond the scanned data: the latent cache (None: load the pixels), the
    run's optimizer steps (token warmup given as a fraction of them) and, with a latent cache,
    the latents' layout: the shape of a stand-in for an unreadable entry."""

    latents: LatentCache | None = None
    max_train_steps: int = 1
    latent_layout: LatentLayout | None = None
    # load reference images' pixels with a latent cache too: the family's text encoder reads
    # them (ModelFamily.text_reads_references)
    reference_pixels: bool = False
    # cache each clip's first-frame condition too (ModelFamily.FIRST_FRAME_CONDITION)
    first_frame: bool = False
    # with the latent cache, the image encoder's states of each sample's first frame, cached
    # per clip (image_state_request) by the encoder's identity, and their [tokens, width]
    image_states: LatentCache | None = None
    image_state_shape: tuple[int, int] | None = None


def latent_request(image: ScannedImage, options: SubsetOptions, flip: bool) -> LatentRequest:
    """The cache entry of an image as a sample with this flip sees it (crops are centered:
    random_crop is refused with a latent cache)."""
    return LatentRequest(
        image.item.path,
        image.bucket,
        None,
        flip,
        options.alpha_mask,
        image.cache_root,
        image.frames,
    )


def first_frame_request(image: ScannedImage, options: SubsetOptions, flip: bool):
    """The cache entry of a sample's first-frame condition: the clip's own request whose pixels
    are its first frame followed by zeros; None for an image or a one-frame clip, which is its
    own condition (its latents' entry serves)."""
    if len(image.frames) < 2:
        return None
    request = latent_request(image, options, flip)
    return dataclasses.replace(request, with_alpha=False, first_frame=True)


def image_state_request(image: ScannedImage, options: SubsetOptions, flip: bool):
    """The cache entry of the image encoder's states of a sample's first frame: the sample's
    own request cut to its first frame (an image: itself), in a cache of the encoder's."""
    request = latent_request(image, options, flip)
    return dataclasses.replace(request, with_alpha=False, frames=request.frames[:1])


def image_state_requests(data: ScannedData) -> list[LatentRequest]:
    """Every image-state cache entry a run can use, in latent_requests' order."""
    return [
        image_state_request(image, options, flip)
        for image, options, flips in _samples(data)
        for flip in flips
    ]


def reference_request(image: ScannedImage, reference: ScannedReference, flip: bool):
    """The cache entry of one of an image's references: at its own size, centered, flipped
    with its image (a pair is flipped as one)."""
    return LatentRequest(reference.path, reference.bucket, None, flip, False, image.cache_root)


def reference_id(reference: ScannedReference, flip: bool) -> str:
    """What identifies a reference as a sample uses it (its bytes, size and flip): the text
    cache keys a caption read together with its references by these."""
    width, height = reference.bucket
    return f"{file_digest(reference.path)}@{width}x{height}" + ("-flipped" if flip else "")


def load_for_cache(request: LatentRequest, clips: ClipFrames | None = None):
    """What LatentCache.build loads for a request: (pixels, alpha, original size, crop); a
    clip's frames from ``clips`` when given (its video decoded once for all its clips)."""
    draws = AugmentDraws(flip=request.flip, crop_fraction=request.crop_fraction, hue_shift=0.0)
    if request.frames and clips is not None:
        image = fit_clip(clips.frames(request.path, request.frames), request.size, draws)
    elif request.frames:
        image = load_training_clip(request.path, request.frames, request.size, draws)
    else:
        image = load_training_image(request.path, request.size, draws, request.with_alpha)
    pixels = first_frame_pixels(image.pixels) if request.first_frame else image.pixels
    return pixels, image.alpha, image.original_size, image.crop_top_left


def cache_loader(requests: Sequence[LatentRequest]) -> Callable[[LatentRequest], tuple]:
    """load_for_cache for a build of ``requests``: each video decoded once for all its clips
    (library.data.clip_frames)."""
    clips = ClipFrames((r.path, r.frames) for r in requests if r.frames)
    return functools.partial(load_for_cache, clips=clips)


def latent_requests(data: ScannedData, first_frame: bool = False) -> list[LatentRequest]:
    """Every cache entry a run can use: each training image (both sides with flip_aug) and
    each validation image, in a fixed order; with ``first_frame``, each clip's first-frame
    condition after the clip (first_frame_request)."""
    requests = []
    for image, options, flips in _samples(data):
        requests += [latent_request(image, options, flip) for flip in flips]
        if first_frame:
            requests += _present(first_frame_request(image, options, f) for f in flips)
        requests += [reference_request(image, r, flip) for flip in flips for r in image.references]
    return requests


def _samples(data: ScannedData):
    """(image, its subset's options, the flips a run sees it with) of each training image
    (both sides with flip_aug) then each validation image (unflipped), dataset by dataset."""
    for scanned in data.scanned:
        for image in scanned.images:
            options = scanned.options[image.subset]
            yield image, options, ((False, True) if options.augment.flip_aug else (False,))
        for image in scanned.validation:
            yield image, scanned.options[image.subset], (False,)


def _present(requests) -> list[LatentRequest]:
    return [request for request in requests if request is not None]


def _first_frame_entry(
    image: ScannedImage, options: SubsetOptions, flip: bool, source: SampleSource, own_mean
) -> dict:
    """The cached posterior mean of a sample's first-frame condition when the source asks for
    it (an image's or one-frame clip's is its own mean, ``own_mean``)."""
    if not source.first_frame:
        return {}
    request = first_frame_request(image, options, flip)
    mean = own_mean if request is None else source.latents.get(request).mean
    return {"first_frame_mean": mean}


def _reference_entries(image: ScannedImage, flip: bool, source: SampleSource) -> dict:
    """The cached latents (or pixels) of an image's references, one list entry per reference;
    the pixels also with a cache when ``source.reference_pixels``."""
    if not image.references:
        return {}
    entries: dict = {"reference_ids": tuple(reference_id(r, flip) for r in image.references)}
    if source.latents is not None:
        cached = [source.latents.get(reference_request(image, r, flip)) for r in image.references]
        entries["reference_means"] = [c.mean for c in cached]
        entries["reference_stds"] = [c.std for c in cached]
    if source.latents is None or source.reference_pixels:
        draws = AugmentDraws(flip=flip, crop_fraction=None, hue_shift=0.0)
        entries["reference_pixels"] = [
            load_training_image(r.path, r.bucket, draws, False).pixels for r in image.references
        ]
    return entries


def _image_entries(
    image: ScannedImage, options: SubsetOptions, draws: AugmentDraws, source: SampleSource
) -> dict:
    """Pixels or cached latents of an image, with its size conditioning and alpha mask."""
    width, height = image.bucket
    if source.latents is not None:
        cached = source.latents.get(latent_request(image, options, draws.flip))
        entries = {"latent_mean": cached.mean, "latent_std": cached.std, "alpha": cached.alpha}
        entries |= _first_frame_entry(image, options, draws.flip, source, cached.mean)
        if source.image_states is not None:
            request = image_state_request(image, options, draws.flip)
            entries["first_frame_state"] = source.image_states.get(request).mean
        original, crop = cached.original_size, cached.crop_top_left
    elif image.frames:
        loaded = load_training_clip(image.item.path, image.frames, image.bucket, draws)
        entries = {"pixel_values": loaded.pixels, "alpha": None}
        original, crop = loaded.original_size, loaded.crop_top_left
    else:
        loaded = load_training_image(image.item.path, image.bucket, draws, options.alpha_mask)
        entries = {"pixel_values": loaded.pixels, "alpha": loaded.alpha}
        original, crop = loaded.original_size, loaded.crop_top_left
    entries.update(
        original_size=original,
        crop_top_left=crop,
        target_size=(height, width),
        cache_root=str(image.cache_root),
        **_reference_entries(image, draws.flip, source),
    )
    return entries


def _stand_in(image: ScannedImage, source: SampleSource) -> dict:
    """Zeros where an unreadable image's pixels (or cached latents) would be, at its bucket size;
    the sample's loss weight 0 makes their values irrelevant."""
    width, height = image.bucket
    frames = image.frame_count
    if source.latents is None:
        clip = (frames,) if image.frames else ()  # an image has no frame axis
        entries = {"pixel_values": torch.zeros(3, *clip, height, width)}
    else:
        latent = torch.zeros(source.latent_layout.shape(1, height, width, frames)[1:])
        entries = {"latent_mean": latent, "latent_std": latent}
        if source.first_frame:
            entries["first_frame_mean"] = latent
        if source.image_states is not None:
            entries["first_frame_state"] = torch.zeros(source.image_state_shape)
    if image.references:
        entries.update(_stand_in_references(image, source))
    return {
        **entries,
        "alpha": None,
        "original_size": (height, width),
        "crop_top_left": (0, 0),
        "target_size": (height, width),
        "cache_root": str(image.cache_root),
    }


def _stand_in_references(image: ScannedImage, source: SampleSource) -> dict:
    """Zeros in the shapes of an unreadable sample's reference entries."""
    entries: dict = {"reference_ids": tuple("unreadable" for _ in image.references)}
    if source.latents is not None:
        latents = [
            torch.zeros(source.latent_layout.shape(1, r.bucket[1], r.bucket[0])[1:])
            for r in image.references
        ]
        entries["reference_means"] = entries["reference_stds"] = latents
    if source.latents is None or source.reference_pixels:
        entries["reference_pixels"] = [
            torch.zeros(3, r.bucket[1], r.bucket[0]) for r in image.references
        ]
    return entries


def _readable_entries(
    image: ScannedImage, options: SubsetOptions, draws: AugmentDraws, source: SampleSource
) -> tuple[dict, str | None]:
    """_image_entries, or a stand-in and the problem when the image or its cache file cannot
    be read now (module docstring)."""
    try:
        return _image_entries(image, options, draws, source), None
    except DataError as error:
        if source.latents is not None and source.latent_layout is None:
            raise  # no shape to stand in with (a cache used outside a training run)
        return _stand_in(image, source), str(error)


def validation_caption(image: ScannedImage, options: SubsetOptions) -> str:
    """The caption of a validation image: the same every time (no shuffling or dropout; a
    wildcard resolves by the image's key)."""
    fixed = options.captions.without_variation()
    position = stable_seed("validation caption", image.key) & 0xFFFFFFFF
    return process_caption(image.item.caption, fixed, seed=0, epoch=0, position=position)


class TrainSamples(Dataset):
    """Map-style dataset indexed by (epoch, SampleRef) pairs (the loader's batch sampler yields
    lists of them, so one loader can serve several epochs)."""

    def __init__(self, data: ScannedData, source: SampleSource) -> None:
        self.data = data
        self.source = source

    def __len__(self) -> int:
        return self.data.schedule.samples_per_epoch

    def __getitem__(self, item: tuple[int, SampleRef]) -> dict:
        epoch, ref = item
        data = self.data
        group = data.groups[ref.dataset]
        spec = group.samples[ref.index]
        scanned = data.scanned[group.dataset]
        image = scanned.images[spec.item]
        options = scanned.options[image.subset]
        global_step = epoch * data.schedule.steps_per_epoch + ref.step
        caption = process_caption(
            image.item.caption,
            options.captions,
            seed=data.seed,
            epoch=epoch,
            position=ref.position,
            global_step=global_step,
            max_train_steps=self.source.max_train_steps,
        )
        draws = draw_augment(options.augment, data.seed, epoch, ref.position)
        entries, unreadable = _readable_entries(image, options, draws, self.source)
        return {
            **entries,
            "caption": caption,
            "loss_weight": 0.0 if ref.padding or unreadable else spec.loss_weight,
            "position": ref.position,
            "epoch": epoch,
            "unreadable": unreadable,
        }


class ValidationSamples(Dataset):
    """Map-style dataset of the held-out images, indexed by (dataset, validation index)."""

    def __init__(self, data: ScannedData, source: SampleSource) -> None:
        self.data = data
        self.source = source

    def __len__(self) -> int:
        return self.data.num_validation_images

    def __getitem__(self, index: tuple[int, int]) -> dict:
        d, i = index
        scanned = self.data.scanned[d]
        image = scanned.validation[i]
        options = scanned.options[image.subset]
        entries, unreadable = _readable_entries(image, options, _NO_AUGMENT, self.source)
        return {
            **entries,
            "caption": validation_caption(image, options),
            "loss_weight": 0.0 if unreadable else 1.0,
            "unreadable": unreadable,
            "position": 0,
            "epoch": 0,
            "validation_key": f"{d}:{image.key}",  # keys its fixed noise; unique over datasets
        }


def _stack_masks(samples: list[dict]) -> torch.Tensor | None:
    """Alpha masks [B, 1, H, W], ones for samples of subsets without alpha_mask; None if none."""
    if all(s["alpha"] is None for s in samples):
        return None
    reference = next(s["alpha"] for s in samples if s["alpha"] is not None)
    return torch.stack(
        [s["alpha"] if s["alpha"] is not None else torch.ones_like(reference) for s in samples]
    ).float()


def collate(samples: list[dict]) -> dict:
    """The batch of a list of samples (see TrainData.loader for its keys)."""
    batch = {
        "captions": [s["caption"] for s in samples],
        "loss_weights": torch.tensor([s["loss_weight"] for s in samples], dtype=torch.float32),
        "positions": torch.tensor([s["position"] for s in samples], dtype=torch.long),
        "epoch": samples[0]["epoch"],
        "cache_roots": [s["cache_root"] for s in samples],
        "original_sizes": torch.tensor([s["original_size"] for s in samples], dtype=torch.long),
        "crop_top_lefts": torch.tensor([s["crop_top_left"] for s in samples], dtype=torch.long),
        "target_sizes": torch.tensor([s["target_size"] for s in samples], dtype=torch.long),
        # what could not be read: stand-ins with loss weight 0 (module docstring)
        "readable": torch.tensor([not s.get("unreadable") for s in samples]),
        "unreadable": [s["unreadable"] for s in samples if s.get("unreadable")],
    }
    if "pixel_values" in samples[0]:
        batch["pixel_values"] = torch.stack([s["pixel_values"] for s in samples])
    else:
        batch["latent_means"] = torch.stack([s["latent_mean"] for s in samples])
        batch["latent_stds"] = torch.stack([s["latent_std"] for s in samples])
    if "first_frame_mean" in samples[0]:
        batch["first_frame_means"] = torch.stack([s["first_frame_mean"] for s in samples])
    if "first_frame_state" in samples[0]:
        batch["first_frame_states"] = torch.stack([s["first_frame_state"] for s in samples])
    for key in ("reference_pixels", "reference_means", "reference_stds"):
        if key in samples[0]:  # one tensor per reference slot: the samples share their sizes
            slots = range(len(samples[0][key]))
            batch[key] = [torch.stack([s[key][k] for s in samples]) for k in slots]
    if "reference_ids" in samples[0]:
        batch["reference_ids"] = [s["reference_ids"] for s in samples]
    masks = _stack_masks(samples)
    if masks is not None:
        batch["alpha_masks"] = masks
    if "validation_key" in samples[0]:
        batch["validation_keys"] = [s["validation_key"] for s in samples]
    return batch
