"""Edit variants: a family's release trained to change a reference image as the caption says
(FLUX.1 Kontext of FLUX.1, Qwen-Image-Edit of Qwen-Image), declared as data and a hook rather
than as a family class of their own.

An edit variant's registry entry names the family class it edits (its ``family``) and carries an
EditVariant (its ``edit``): what differs before any weight is read (the name in messages, how
many reference images a sample takes, whether the text encoder reads them) is the variant's
data, and what differs in training and sampling (how the reference latents enter the denoiser,
how the caption is read with the references, the sampling pipeline) are its hooks, which the
base family calls where the variant gives one. The family instances built for the variant carry
the same EditVariant, by which the registry knows their entry (registry.entry_of).

Readable without torch or diffusers: the hooks are named and imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# How many reference images a sample pairs with its target: (least, most), most None for no
# bound; (0, 0) for a text-to-image model.
ReferenceCounts = tuple[int, int | None]


@dataclass(frozen=True, kw_only=True)
class EditHooks:
    """What an edit variant changes in its base family's behaviour; the base family says which
    it calls and with what. ``context``: the denoiser inputs the reference latents become
    (called with the family, the Conditioning and the dtype; FLUX.1's family takes packed
    tokens and their position ids, Qwen-Image's one-frame latents). ``sampling_pipeline``: the
    pipeline kind sampling the variant (called with the family). ``text_with_references``: the
    text conditioning of captions read with their references (ModelFamily
    .encode_text_with_references' arguments, the family first), for a variant whose text
    encoder reads them. ``reference_size``: the size a sample prompt's reference is fitted to
    (ModelFamily.sample_reference_size's arguments, the family first); unset: the image's."""

    context: Callable[..., Any]
    sampling_pipeline: Callable[[Any], Any]
    text_with_references: Callable[..., Any] | None = None
    reference_size: Callable[..., tuple[int, int]] | None = None


@dataclass(frozen=True, kw_only=True)
class EditVariant:
    """An edit variant of a family (module docstring).

    ``entry``: the name of its registry entry. ``label``: its name in messages (its entry's
    label). ``reference_images``: how many reference images a sample takes (ReferenceCounts).
    ``text_reads_references``: its text encoder reads the references with the caption (the text
    cache keys an entry by both). ``model_type``: kohya's model_type of its models, where its
    trainers write one (None: the base family's). ``described_as``: (the base family's words in
    the run plan's description, the variant's). ``hooks``: its EditHooks (a Deferred's ``get``)."""

    entry: str
    label: str
    reference_images: ReferenceCounts
    text_reads_references: bool = False
    model_type: str | None = None
    described_as: tuple[str, str]
    hooks: Callable[[], EditHooks]

    def describe(self, text: str) -> str:
        """The base family's description ``text`` in the variant's words."""
        return text.replace(*self.described_as, 1)


def references_text(counts: ReferenceCounts) -> str:
    """How many reference images a sample takes, in words: "no reference images",
    "1 reference image", "at least 1 reference image", "1 to 3 reference images"."""
    low, high = counts
    if high == 0:
        return "no reference images"
    plural = "s" if (high or low) != 1 else ""
    if high == low:
        return f"{low} reference image{plural}"
    if high is None:
        return f"at least {low} reference image{'s' if low != 1 else ''}"
    return f"{low} to {high} reference images"


def takes_references(counts: ReferenceCounts, count: int) -> bool:
    """Whether a sample with ``count`` reference images fits ``counts``."""
    low, high = counts
    return low <= count and (high is None or count <= high)
