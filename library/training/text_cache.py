"""A cache of frozen text encoders' outputs, keyed by the final caption text.

For UNet-only training the text encoders never change, so a caption's conditioning
(``TextConditioning``: hidden states and SDXL's pooled embedding) only needs computing once.
An entry is keyed by the caption *as the UNet sees it* (after shuffling, dropout, prefixes)
together with an identity of everything else that changes the output (``text_identity``).

How it meets caption augmentation: the cache never decides what a caption is; it looks up the
final text it is given. So with shuffle_caption, tag dropout or caption dropout, each distinct
variant a step draws is encoded the first time it appears (only the captions not yet cached
are encoded, each distinct one once, in one call) and reused whenever it comes back; memory
grows with the number of distinct variants seen, not with the number of steps. Deterministic
captions (no augmentation) can all be encoded up front with ``prefill``, after which training
encodes nothing.

Memory entries live on the CPU in the dtype ``encode`` returned. Where ``encode`` gives each
caption's own length (``TextConditioning.lengths``: a family whose captions keep their own
lengths), an entry holds that caption's states alone, and a batch of rows of different lengths
comes back zero-padded to the longest, with the lengths; other families' rows all have the
encoders' fixed length and come back stacked as before. With ``to_disk`` each entry
is also a file ``<root>/text/<key>.safetensors`` (``root`` is the sample's dataset folder),
holding "hidden" [T, C] and, for SDXL, "pooled" [P], with metadata {"caption", "identity",
"checksum"} (the checksum is content_hash.tensor_digest of the tensors). A file that is damaged
is ignored and the caption encoded again, with one warning naming the file; the new file replaces
it. Damaged means: its metadata does not match (a foreign file, a hash collision), it cannot be
read (truncated, corrupt), its tensors do not match the checksum (edited, overwritten) or hold a
NaN or an Inf, or it has no checksum.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from library.data.cache_group import CacheGroup, gather_in_rounds
from library.data.content_hash import all_finite, tensor_digest, tensors_damage
from library.data.latent_cache import CACHE_PLACE
from library.errors import DataError
from library.models.conditioning import TextConditioning
from library.saving.atomic import atomic_write_file

log = logging.getLogger(__name__)

# Bump when the encoding code or the file changes what a caption's entry holds, so old files
# miss. 2: files hold a checksum of their tensors.
CACHE_FORMAT = "difftune-text-cache-2"

Encode = Callable[[list[str]], TextConditioning]
Entry = tuple[torch.Tensor, torch.Tensor | None]  # (hidden [T, C], pooled [P] or None) on CPU
# What a rank with no captions left encodes while the others still call a sharded encoder
PAD_CAPTION = ""


def _update_with_tensor(digest, name: str, tensor: torch.Tensor) -> None:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}\n".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())


def text_identity(
    family,
    text_encoders: Sequence[torch.nn.Module],
    clip_skip: int | None,
    max_token_length: int | None,
    dtype: torch.dtype | None,
    *,
    tokenizers: Sequence[object] | None = None,
) -> str:
    """A hex digest of everything besides the caption that decides the encoders' output.

    It covers the family name, every encoder's state_dict (names in sorted order with dtype,
    shape and bytes), ``clip_skip``, ``max_token_length`` and ``dtype``, so any weight change
    gives another identity. ``tokenizers`` (optional) adds each tokenizer's special tokens,
    length and vocabulary (a different padding token changes the output too).
    """
    name = getattr(family, "text_cache_name", getattr(family, "name", family))
    digest = hashlib.sha256(f"{CACHE_FORMAT}|{name}\n".encode())
    for index, encoder in enumerate(text_encoders):
        inner = getattr(encoder, "module", encoder)  # unwrap DistributedDataParallel
        state = inner.state_dict()
        digest.update(f"encoder {index}: {len(state)} tensors\n".encode())
        for name in sorted(state):
            _update_with_tensor(digest, name, state[name])
    for index, tok in enumerate(tokenizers or ()):
        ids = (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.model_max_length)
        vocab = sorted(tok.get_vocab().items())
        digest.update(f"tokenizer {index}: {ids} {vocab}\n".encode())
        # a processor that also prepares images names its settings (plain tokenizers add
        # nothing, so their caches keep their identity)
        settings = getattr(tok, "cache_settings", None)
        if settings is not None:
            digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    digest.update(f"clip_skip={clip_skip}|max_token_length={max_token_length}|{dtype}".encode())
    return digest.hexdigest()


class _Damaged(Exception):
    """A text cache file that exists but cannot be used; the message says why."""


class TextEncoderCache:
    """Per-caption text-encoder outputs in memory and optionally on disk (module docstring)."""

    def __init__(self, identity: str, to_disk: bool) -> None:
        self.identity = identity
        self.to_disk = to_disk
        self.encoded = 0  # captions passed to ``encode`` so far
        self._memory: dict[str, Entry] = {}
        self._target: tuple[torch.device, torch.dtype] | None = None  # of encode's last output

    def key(self, caption: str) -> str:
        """The file stem of ``caption``'s entry under this identity."""
        return hashlib.sha256(f"{self.identity}\n{caption}".encode()).hexdigest()

    def path(self, root: Path | str, caption: str) -> Path:
        """Where ``caption``'s entry is stored under the dataset folder ``root``."""
        return Path(root) / "text" / f"{self.key(caption)}.safetensors"

    def get(
        self, captions: list[str], roots: list[Path] | None, encode: Encode
    ) -> TextConditioning:
        """The rows of ``captions`` in order, encoding only those not cached (module docstring).

        ``roots[i]`` is caption i's dataset folder (used with ``to_disk``; None otherwise).
        Rows come on the device and dtype ``encode`` returned (of this call, else its last
        call; before any call, CPU in the stored dtype).
        """
        missing = self._missing(captions, roots)
        fresh: dict[str, tuple[TextConditioning, int]] = {}
        if missing:
            out = self._encode_and_store(list(missing), missing, encode)
            fresh = {caption: (out, j) for j, caption in enumerate(missing)}
        hidden_rows, pooled_rows = [], []
        for caption in captions:
            if caption in fresh:
                out, j = fresh[caption]
                hidden_rows.append(_own_row(out, j))
                pooled_rows.append(None if out.pooled is None else out.pooled[j])
            else:
                hidden, pooled = self._memory[caption]
                hidden_rows.append(self._to_target(hidden))
                pooled_rows.append(None if pooled is None else self._to_target(pooled))
        return _stack(hidden_rows, pooled_rows)

    def prefill(
        self,
        captions: list[str],
        roots: list[Path] | None,
        encode: Encode,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        progress: bool = False,
        lockstep: CacheGroup | None = None,
    ) -> int:
        """Encode, in batches of ``batch_size``, the distinct captions not yet cached.

        With ``world_size`` > 1 and ``to_disk`` this rank takes only every ``world_size``-th
        distinct caption (from ``rank``), encodes those missing and writes their files; the
        caller puts a barrier after, then every rank's ``get`` reads the others' files. Without disk
        each rank needs every entry in its own memory, so it encodes them all. Returns how
        many captions this rank encoded.

        ``lockstep`` (the ranks' group; sharded encoders, each call a collective): every rank
        calls ``encode`` as often as the rank with the most batches, the extra calls on one
        empty caption whose output is dropped; with ``world_size`` > 1 the captions are then
        shared out without disk too, and the memory entries exchanged after.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        _check_roots(captions, roots)
        exchange = world_size > 1 and lockstep is not None and not self.to_disk
        if world_size > 1 and (self.to_disk or exchange):
            captions, roots = _shard(captions, roots, rank, world_size)
        missing = list(self._missing(captions, roots).items())
        batches = [missing[i : i + batch_size] for i in range(0, len(missing), batch_size)]
        pads = 0
        if lockstep is not None:
            pads = max(lockstep.all_gather_object(len(batches))) - len(batches)
        if progress:
            from tqdm import tqdm

            batches = tqdm(batches, desc="caching text-encoder outputs", unit="batch")
        for chunk in batches:
            part = dict(chunk)
            self._encode_and_store(list(part), part, encode)
        for _ in range(pads):
            encode([PAD_CAPTION])  # the other ranks' calls need this rank's part of the encoder
        if exchange:
            self._exchange(lockstep, [caption for caption, _ in missing])
        return len(missing)

    def _exchange(self, group: CacheGroup, encoded: list[str]) -> None:
        """Every rank's entries of ``encoded`` (its own captions) in every rank's memory."""
        mine = [(caption, self._memory[caption]) for caption in encoded]
        for caption, entry in gather_in_rounds(group, mine):
            self._memory.setdefault(caption, entry)

    def _missing(self, captions: list[str], roots: list[Path] | None) -> dict[str, set[Path]]:
        """Distinct captions (first-seen order) in neither memory nor a valid file, each with
        the folders whose file it lacks; loads the files found into memory."""
        _check_roots(captions, roots)
        missing: dict[str, set[Path]] = {}
        for index, caption in enumerate(captions):
            if caption in self._memory:
                continue
            root = roots[index] if self.to_disk and roots is not None else None
            if root is not None and Path(root) in missing.get(caption, ()):
                continue  # this file was read (and warned of) already
            if root is not None:
                entry = self._load(self.path(root, caption), caption)
                if entry is not None:
                    self._memory[caption] = entry
                    missing.pop(caption, None)
                    continue
            missing.setdefault(caption, set())
            if root is not None:
                missing[caption].add(Path(root))
        return missing

    def _encode_and_store(
        self, captions: list[str], folders: dict[str, set[Path]], encode: Encode
    ) -> TextConditioning:
        """One ``encode`` call for ``captions``; every row kept in memory and written to disk."""
        out = encode(captions)
        self.encoded += len(captions)
        if out.hidden.shape[0] != len(captions):
            raise ValueError(f"encode gave {out.hidden.shape[0]} rows for {len(captions)} captions")
        self._target = (out.hidden.device, out.hidden.dtype)
        if not (all_finite(out.hidden) and (out.pooled is None or all_finite(out.pooled))):
            # A stored NaN would be refused as damaged on every read; say so where it starts.
            pooled = [True] * len(captions) if out.pooled is None else map(all_finite, out.pooled)
            finite = [all_finite(h) and p for h, p in zip(out.hidden, pooled, strict=True)]
            raise DataError(
                "the text encoders gave NaN or Inf outputs for the caption "
                f"{captions[finite.index(False)]!r}; in float16 they can overflow: train in "
                "another precision"
            )
        for j, caption in enumerate(captions):
            hidden = _own_row(out, j).detach().to("cpu").clone()
            pooled = None if out.pooled is None else out.pooled[j].detach().to("cpu").clone()
            self._memory[caption] = (hidden, pooled)
            for root in sorted(folders.get(caption, ())):
                self._save(self.path(root, caption), caption, hidden, pooled)
        return out

    def _to_target(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._target is None:
            return tensor
        device, dtype = self._target
        return tensor.to(device=device, dtype=dtype)

    def _save(self, path: Path, caption: str, hidden: torch.Tensor, pooled) -> None:
        tensors = {"hidden": hidden} if pooled is None else {"hidden": hidden, "pooled": pooled}
        metadata = {
            "caption": caption,
            "identity": self.identity,
            "checksum": tensor_digest(tensors),
        }
        atomic_write_file(
            path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata), CACHE_PLACE
        )

    def _load(self, path: Path, caption: str) -> Entry | None:
        """The entry in ``path`` when it is this caption's under this identity and undamaged;
        None when there is no file, or (with a warning naming it) when it cannot be used."""
        if not path.is_file():
            return None
        try:
            entry = self._read(path, caption)
        except _Damaged as damaged:
            log.warning("text cache entry %s was damaged (%s); re-encoded", path, damaged)
            return None
        return entry

    def _read(self, path: Path, caption: str) -> Entry:
        """The verified entry in ``path``; raises _Damaged saying what is wrong."""
        try:
            with safe_open(str(path), framework="pt") as file:
                meta = file.metadata() or {}
                if meta.get("caption") != caption or meta.get("identity") != self.identity:
                    raise _Damaged("it belongs to another caption or model")
                names = set(file.keys())
                if names not in ({"hidden"}, {"hidden", "pooled"}):
                    raise _Damaged(f"it holds tensors {sorted(names)}")
                tensors = {name: file.get_tensor(name) for name in names}
        except _Damaged:
            raise
        except Exception as exc:  # any unreadable file (truncated, corrupt) is re-encoded
            raise _Damaged(f"unreadable: {exc}") from exc
        damage = tensors_damage(tensors, meta.get("checksum"))
        if damage is not None:
            raise _Damaged(damage)
        hidden, pooled = tensors["hidden"], tensors.get("pooled")
        if hidden.dim() != 2 or (pooled is not None and pooled.dim() != 1):
            raise _Damaged("unexpected tensor shapes")
        return hidden, pooled


def _check_roots(captions: list[str], roots: list[Path] | None) -> None:
    if roots is not None and len(roots) != len(captions):
        raise ValueError(f"got {len(roots)} roots for {len(captions)} captions")


def _shard(
    captions: list[str], roots: list[Path] | None, rank: int, world_size: int
) -> tuple[list[str], list[Path] | None]:
    """The captions (with their roots) whose distinct caption falls to ``rank``.

    The split is over the distinct captions of the input, not over what is missing: ranks
    running at once see each other's files appear, and a split of what is missing would then
    differ between ranks and leave captions out.
    """
    ordinal = {caption: i for i, caption in enumerate(dict.fromkeys(captions))}
    keep = [i for i, caption in enumerate(captions) if ordinal[caption] % world_size == rank]
    return [captions[i] for i in keep], None if roots is None else [roots[i] for i in keep]


def _own_row(out: TextConditioning, j: int) -> torch.Tensor:
    """Row ``j`` of ``out``'s hidden states, cut to the caption's own length when ``out`` has
    lengths (the rest is padding)."""
    if out.lengths is None:
        return out.hidden[j]
    return out.hidden[j, : int(out.lengths[j])]


def _stack(hidden_rows: list[torch.Tensor], pooled_rows: list) -> TextConditioning:
    sizes = [row.shape[0] for row in hidden_rows]
    lengths = None
    if len(set(sizes)) > 1:  # captions of their own lengths: zero-padded to the longest
        hidden = torch.nn.utils.rnn.pad_sequence(hidden_rows, batch_first=True)
        lengths = torch.tensor(sizes, dtype=torch.long)
    else:
        hidden = torch.stack(hidden_rows)
    if all(p is None for p in pooled_rows):
        return TextConditioning(hidden, None, lengths=lengths)
    if any(p is None for p in pooled_rows):
        raise DataError(
            "text cache entries disagree on having a pooled embedding; delete the datasets' "
            "text/ cache folders so they are rebuilt"
        )
    return TextConditioning(hidden, torch.stack(pooled_rows), lengths=lengths)
