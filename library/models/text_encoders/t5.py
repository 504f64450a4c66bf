"""The T5 text-encoder kind: its tokenizer (tokenizer.json, or spiece.model with sentencepiece),
found offline and checked against the encoder's config before any weight is read, and captions
-> T5's last hidden states with the padding mask (``t5_states``).

A family says where its T5 tokenizer may be found (``T5TokenizerPlaces``: the repositories, and
their subfolders, whose tokenizer fits its encoder, for kohya's ``tokenizer_cache_dir`` and the
local Hugging Face cache); ``t5_tokenizer_path`` (or the tokenizer subfolder under it) comes
first. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from library.errors import ModelError
from library.models.model_files import read_tokenizer
from library.models.tokenizer_fit import (
    TokenizerSource,
    check_folder_kind,
    check_tokenizer,
    encoder_kind,
)

# T5 v1.1 XXL's own repository: its tokenizer fits every T5-XXL encoder.
T5_XXL_REPO = ("google/t5-v1_1-xxl", "")


def _usable(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "spiece.model").is_file()


def t5_tokenizer_files(folder: Path, fix: str) -> Path:
    """``folder`` after checking it has files transformers can read without sentencepiece."""
    if (folder / "tokenizer.json").is_file():
        return folder
    if (folder / "spiece.model").is_file():
        if importlib.util.find_spec("sentencepiece") is not None:
            return folder
        # transformers 5 converts spiece.model to its fast tokenizer only through the
        # sentencepiece package (without it, it falls back to tiktoken and fails).
        raise ModelError(
            f"{folder} has spiece.model but no tokenizer.json, and reading spiece.model needs "
            "the sentencepiece package, which is not installed; add the tokenizer.json of the "
            "same tokenizer (a diffusers folder's T5 tokenizer subfolder has one) or pip "
            "install sentencepiece"
        )
    raise ModelError(f"{folder} lacks tokenizer.json (the T5 tokenizer); {fix}")


def hub_t5_tokenizer_folder(
    repos: tuple[tuple[str, str], ...], hub_cache: str | Path | None
) -> Path | None:
    """The first folder of ``repos`` ((repo id, subfolder)) with a T5 tokenizer in the local
    Hugging Face cache; never a network call."""
    from huggingface_hub import try_to_load_from_cache

    for repo, sub in repos:
        for name in ("tokenizer.json", "spiece.model"):
            try:
                hit = try_to_load_from_cache(repo, f"{sub}/{name}" if sub else name, hub_cache)
            except (OSError, ValueError):
                hit = None
            if isinstance(hit, str):
                return Path(hit).parent
    return None


@dataclass(frozen=True)
class T5TokenizerPlaces:
    """Where a family's T5 tokenizer may be found, and how its messages say so.

    ``repos``: (repo id, subfolder) whose tokenizer fits the family's encoder, searched in
    kohya's ``tokenizer_cache_dir`` layout (by repo id) and the Hugging Face cache; ``sub``: the
    tokenizer subfolder of the family's diffusers folders (``t5_tokenizer_path`` may name the
    folder above it); ``copy_from``: where a user finds the files, as messages say it."""

    repos: tuple[tuple[str, str], ...]
    sub: str
    copy_from: str

    def find(
        self, t5_tokenizer_path: str | None, cache_dir: str | None,
        hub_cache: str | Path | None = None,
    ) -> Path | None:  # fmt: skip
        """The first local folder with a T5 tokenizer: ``t5_tokenizer_path`` (or its ``sub``/),
        else kohya's ``tokenizer_cache_dir`` layout, else the Hugging Face cache."""
        if t5_tokenizer_path:
            root = Path(t5_tokenizer_path).expanduser()
            found = [f for f in (root / self.sub, root) if _usable(f)]
            return found[0] if found else None  # an explicit path that does not fit is reported
        if cache_dir:
            for repo, _sub in self.repos:
                folder = Path(cache_dir).expanduser() / repo.replace("/", "_")
                if _usable(folder):
                    return folder
        return hub_t5_tokenizer_folder(self.repos, hub_cache)

    def missing(self, path_text: str | None, model_file: Path) -> str:
        """Why no T5 tokenizer was found for ``model_file``, and the fix."""
        if path_text:
            return (
                f"t5_tokenizer_path {path_text} has no tokenizer.json (nor a {self.sub}/ "
                f"subfolder with one); copy the T5 tokenizer files of {self.copy_from} there"
            )
        return (
            f"{model_file.name} carries no T5 tokenizer and none was found locally: set "
            f"t5_tokenizer_path in [flow] to a folder with tokenizer.json ({self.copy_from}); "
            "tokenizer_cache_dir and the Hugging Face cache were searched too, nothing is "
            "downloaded"
        )

    def located(
        self, t5_tokenizer_path: str | None, cache_dir: str | None, model_file: Path
    ) -> tuple[Path, TokenizerSource]:
        """The T5 tokenizer folder found for ``model_file`` and which key chose it."""
        found = self.find(t5_tokenizer_path, cache_dir)
        missing = self.missing(t5_tokenizer_path, model_file)
        return located_t5_tokenizer(found, t5_tokenizer_path, cache_dir, missing)


# Where T5-XXL's tokenizer is found beside single files of the transformers that take it with
# T5 v1.1 XXL (t5_tokenizer_path, or its tokenizer_2/; else google's repository or the
# diffusers repositories whose tokenizer_2/ holds it, in tokenizer_cache_dir or the Hugging
# Face cache): one definition for every family that reads it so.
T5_XXL_PLACES = T5TokenizerPlaces(
    repos=(
        T5_XXL_REPO,
        ("black-forest-labs/FLUX.1-dev", "tokenizer_2"),
        ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
    ),
    sub="tokenizer_2",
    copy_from="a FLUX.1 diffusers folder's tokenizer_2/, or google/t5-v1_1-xxl's files",
)


def load_t5_tokenizer(folder: Path, config: Mapping, source: TokenizerSource):
    """The T5 tokenizer in ``folder``, checked against T5-XXL's ``config`` (kind, vocabulary,
    end and padding ids)."""
    from transformers import T5TokenizerFast

    kind = encoder_kind(config, "t5")
    check_folder_kind(folder, kind, "T5-XXL", source)
    needs = "tokenizer.json (as a diffusers folder's T5 tokenizer subfolder has)"
    tokenizer = read_tokenizer(T5TokenizerFast, folder, needs, "T5 tokenizer")
    check_tokenizer(tokenizer, folder, config, kind, "T5-XXL", source)
    # model_max_length stays as the folder says: the family decides how many tokens to use.
    return tokenizer


def located_t5_tokenizer(
    found: Path | None, t5_tokenizer_path: str | None, cache_dir: str | None, missing: str
) -> tuple[Path, TokenizerSource]:
    """The T5 tokenizer folder a finder ``found`` (None: ModelError ``missing``) and which key
    chose it, after checking it has files transformers can read."""
    if t5_tokenizer_path and Path(t5_tokenizer_path).expanduser().is_file():
        raise ModelError(
            f"t5_tokenizer_path {t5_tokenizer_path} is a file; set it to the folder that holds "
            "tokenizer.json"
        )
    if found is None:
        raise ModelError(missing)
    folder = t5_tokenizer_files(found, "set t5_tokenizer_path in [flow] to a folder with it")
    files = "T5-XXL's tokenizer.json"
    return folder, TokenizerSource.chosen(
        folder, "t5_tokenizer_path", t5_tokenizer_path, cache_dir, files
    )


def tokenize_t5(tokenizer, captions: Sequence[str], max_length: int):
    """The tokenizer's output for ``captions``: ids and padding mask [B, max_length], padded
    on the right and truncated there."""
    return tokenizer(
        list(captions), padding="max_length", max_length=max_length, truncation=True,
        return_tensors="pt",
    )  # fmt: skip


def t5_states(
    tokenizer, t5, captions: Sequence[str], max_length: int, device, masked: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(T5's last hidden states [B, max_length, width], the padding mask [B, max_length]) of
    ``captions``; ``masked``: T5 runs with the padding mask (else it attends to the padding)."""
    tokens = tokenize_t5(tokenizer, captions, max_length)
    mask = tokens.attention_mask.to(device)
    weight = next(t5.parameters())
    if weight.is_meta:
        # The dry run's memory estimate runs the models on the meta device, where T5's
        # padding-mask code reads values. T5 never trains there, so its forward keeps nothing
        # for backward: only the states' shape and dtype matter.
        shape = (*tokens.input_ids.shape, t5.config.d_model)
        return torch.empty(shape, device="meta", dtype=weight.dtype), mask
    ids = tokens.input_ids.to(device)
    return t5(ids, attention_mask=mask if masked else None).last_hidden_state, mask
