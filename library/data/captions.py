"""Caption operations: wildcards, caption dropout, tag shuffle/dropout, token warmup, prefix/suffix.

The option names are kohya-ss sd-scripts' dataset keys. `process_caption` applies them in this
order; every random choice is a pure function of (seed, epoch, position) and the operation's name,
so a sample gets the same caption on any number of processes, workers or micro-batches.

1. Wildcards (enable_wildcard). If the caption has several non-empty lines, one of them (stripped)
   is chosen; then every brace group `{a|b|c}` is replaced by one of its `|`-separated
   alternatives, each group drawn independently. A group without `|` (`{a}`) becomes its text,
   an empty group `{}` stays literal, and braces do not nest (only innermost groups are replaced).
   Without enable_wildcard braces are ordinary text and the caller passes one line.
2. Whole-caption dropout. The caption becomes "" (prefix and suffix too: the sample trains the
   unconditional prompt) when caption_dropout_every_n_epochs = N > 0 and (epoch + 1) % N == 0
   (epoch is 0-based; kohya counts epochs from 1, so it drops on its epochs N, 2N, ...), or else
   with probability caption_dropout_rate.
3. Tag operations, done only when one of them is configured (shuffle_caption,
   caption_tag_dropout_rate > 0, token_warmup_step > 0, keep_tokens > 0, keep_tokens_separator,
   secondary_separator); otherwise the caption text is left exactly as written.
   - The caption is split on caption_separator; tags are stripped and empty tags dropped.
   - Fixed tags never move or drop. If keep_tokens_separator is set and occurs in the caption,
     the text before its first occurrence is the fixed head, the text after a second occurrence
     the fixed tail, and the text between them the flexible tags (further occurrences count as
     caption separators). Otherwise the first keep_tokens tags are the head and the rest flexible.
   - Token warmup keeps the first k flexible tags as written, k = token_warmup_min +
     floor((n - token_warmup_min) * global_step / W) clipped to [0, n], n the flexible tag count.
     W is token_warmup_step, or token_warmup_step * max_train_steps when it is below 1 (a
     fraction of training). No warmup when W == 0 or global_step >= W.
   - Tag dropout then drops each remaining flexible tag with probability
     caption_tag_dropout_rate (drawn per tag, keyed by its index in the written order).
   - shuffle_caption then shuffles the surviving flexible tags.
   - secondary_separator: a tag may hold sub-tags joined by it ("black;;;hair"); the tag moves
     and drops as one, and in the output its sub-tags (stripped, empty ones dropped) are joined
     like tags.
   - Output: head + flexible + tail joined by caption_separator plus one space (", " for ","; a
     separator that already ends in whitespace is used as is).
4. caption_prefix and caption_suffix are added last, outside tag operations and exactly as
   written: prefix + caption + suffix. They add no separator of their own, so write it into them
   ("sks dog, " as a prefix, ", best quality" as a suffix). This differs from kohya, which inserts
   them before shuffling (as fixed tags) joined with a space.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, fields, replace

from library.data.schedule import permutation, stable_seed

_WILDCARD = re.compile(r"\{([^{}]+)\}")


@dataclass(frozen=True)
class CaptionOptions:
    """A subset's caption options (kohya's key names and defaults); validated on construction."""

    shuffle_caption: bool = False
    caption_separator: str = ","
    keep_tokens: int = 0
    keep_tokens_separator: str = ""
    secondary_separator: str = ""
    enable_wildcard: bool = False
    caption_prefix: str = ""
    caption_suffix: str = ""
    caption_dropout_rate: float = 0.0
    caption_dropout_every_n_epochs: int = 0
    caption_tag_dropout_rate: float = 0.0
    token_warmup_min: int = 1
    token_warmup_step: float = 0.0

    def __post_init__(self) -> None:
        self.check()

    @classmethod
    def from_subset(cls, subset: object) -> CaptionOptions:
        """The options of a subset config object; a missing attribute or None means the default."""
        values = {}
        for field in fields(cls):
            value = getattr(subset, field.name, None)
            if value is not None:
                values[field.name] = value
        return cls(**values)

    def check(self) -> None:
        """Raise ValueError naming the option when a value is out of range."""
        for name in ("caption_dropout_rate", "caption_tag_dropout_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        for name in ("keep_tokens", "token_warmup_min", "caption_dropout_every_n_epochs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if not self.token_warmup_step >= 0:
            raise ValueError(f"token_warmup_step must be 0 or more, got {self.token_warmup_step}")
        if not self.caption_separator:
            raise ValueError("caption_separator must not be empty")
        for name in ("keep_tokens_separator", "secondary_separator"):
            if getattr(self, name) == self.caption_separator:
                raise ValueError(
                    f'{name} must differ from caption_separator "{self.caption_separator}"'
                )

    @property
    def is_random(self) -> bool:
        """True when the result can differ between (epoch, position, global_step)."""
        return (
            self.enable_wildcard
            or self.shuffle_caption
            or self.caption_dropout_rate > 0
            or self.caption_dropout_every_n_epochs > 0
            or self.caption_tag_dropout_rate > 0
            or self.token_warmup_step > 0
        )

    def without_variation(self) -> CaptionOptions:
        """These options with shuffling, dropout and token warmup off: what stays is the same
        for every epoch (wildcards still pick by the key)."""
        return replace(
            self,
            shuffle_caption=False,
            caption_dropout_rate=0.0,
            caption_dropout_every_n_epochs=0,
            caption_tag_dropout_rate=0.0,
            token_warmup_step=0.0,
        )

    @property
    def has_tag_operations(self) -> bool:
        """True when the caption is split into tags (step 3 of the module docstring)."""
        return bool(
            self.shuffle_caption
            or self.caption_tag_dropout_rate > 0
            or self.token_warmup_step > 0
            or self.keep_tokens > 0
            or self.keep_tokens_separator
            or self.secondary_separator
        )


def _uniform(*key: int | str) -> float:
    """A uniform float in [0, 1) that depends only on `key`."""
    return stable_seed(*key) / 2.0**64


def _choice(count: int, *key: int | str) -> int:
    """An index in range(count) that depends only on `key` (bias < count / 2**64)."""
    return stable_seed(*key) % count


def _apply_wildcards(caption: str, key: tuple[int | str, ...]) -> str:
    lines = [line.strip() for line in caption.splitlines() if line.strip()]
    if len(lines) > 1:
        caption = lines[_choice(len(lines), *key, "line")]
    elif lines:
        caption = lines[0]
    groups = itertools.count()

    def pick(match: re.Match[str]) -> str:
        alternatives = match.group(1).split("|")
        return alternatives[_choice(len(alternatives), *key, "wildcard", next(groups))]

    return _WILDCARD.sub(pick, caption)


def _is_dropped(options: CaptionOptions, epoch: int, key: tuple[int | str, ...]) -> bool:
    every = options.caption_dropout_every_n_epochs
    if every > 0 and (epoch + 1) % every == 0:
        return True
    rate = options.caption_dropout_rate
    return rate > 0 and _uniform(*key, "caption_dropout") < rate


def _split_tags(text: str, separator: str) -> list[str]:
    return [tag.strip() for tag in text.split(separator) if tag.strip()]


def _fixed_and_flexible(
    caption: str, options: CaptionOptions
) -> tuple[list[str], list[str], list[str]]:
    """(head, flexible, tail) tags of a caption."""
    separator = options.caption_separator
    marker = options.keep_tokens_separator
    if marker and marker in caption:
        head, _, rest = caption.partition(marker)
        flexible, _, tail = rest.partition(marker)
        tail = tail.replace(marker, separator)
        return (
            _split_tags(head, separator),
            _split_tags(flexible, separator),
            _split_tags(tail, separator),
        )
    tags = _split_tags(caption, separator)
    return tags[: options.keep_tokens], tags[options.keep_tokens :], []


def warmup_tag_count(
    n: int, options: CaptionOptions, global_step: int, max_train_steps: int
) -> int:
    """How many of n flexible tags token warmup keeps at optimizer step `global_step` (0-based)."""
    steps = options.token_warmup_step
    if 0 < steps < 1:
        if max_train_steps < 1:
            raise ValueError(f"max_train_steps must be at least 1, got {max_train_steps}")
        steps *= max_train_steps
    if steps == 0 or global_step >= steps:
        return n
    minimum = options.token_warmup_min
    k = minimum + math.floor((n - minimum) * global_step / steps)
    return max(0, min(n, k))


def _process_tags(
    caption: str,
    options: CaptionOptions,
    key: tuple[int | str, ...],
    global_step: int,
    max_train_steps: int,
) -> str:
    head, flexible, tail = _fixed_and_flexible(caption, options)
    flexible = flexible[: warmup_tag_count(len(flexible), options, global_step, max_train_steps)]
    rate = options.caption_tag_dropout_rate
    if rate > 0:
        flexible = [
            tag for i, tag in enumerate(flexible) if _uniform(*key, "tag_dropout", i) >= rate
        ]
    if options.shuffle_caption and len(flexible) > 1:
        order = permutation(len(flexible), stable_seed(*key, "shuffle"))
        flexible = [flexible[i] for i in order]
    separator = options.caption_separator
    joiner = separator if separator[-1].isspace() else separator + " "
    tags = head + flexible + tail
    if options.secondary_separator:
        tags = [joiner.join(_split_tags(tag, options.secondary_separator)) for tag in tags]
    return joiner.join(tag for tag in tags if tag)


def process_caption(
    caption: str,
    options: CaptionOptions,
    *,
    seed: int,
    epoch: int,
    position: int,
    global_step: int = 0,
    max_train_steps: int = 1,
) -> str:
    """The caption trained for one sample (rules in the module docstring).

    `caption` is the raw caption (several lines only with enable_wildcard), `epoch` 0-based,
    `position` the sample's position in the epoch, `global_step` the 0-based optimizer step it is
    trained at. The result is a pure function of the arguments; with default options it is
    `caption` unchanged.
    """
    key = (seed, "caption", epoch, position)
    if options.enable_wildcard:
        caption = _apply_wildcards(caption, key)
    if _is_dropped(options, epoch, key):
        return ""
    if options.has_tag_operations:
        caption = _process_tags(caption, options, key, global_step, max_train_steps)
    return options.caption_prefix + caption + options.caption_suffix
