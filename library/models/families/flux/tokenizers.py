"""The tokenizers of FLUX.1: CLIP-L's (as for SD) and T5-XXL's (tokenizer.json), found offline.

T5's comes from ``t5_tokenizer_path``, else kohya's ``tokenizer_cache_dir``, else the local Hugging
Face cache (google/t5-v1_1-xxl, or a FLUX.1 repository's tokenizer_2/); nothing is downloaded.
Each tokenizer is checked against its encoder's config before any weight is read
(library.models.tokenizer_fit).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

from library.errors import ModelError
from library.models.loader import read_tokenizer
from library.models.tokenizer_fit import (
    TokenizerSource,
    check_folder_kind,
    check_tokenizer,
    encoder_kind,
)

# (repo id, subfolder) whose T5 tokenizer fits FLUX.1, for tokenizer_cache_dir and the Hub cache.
_T5_REPOS = (
    ("google/t5-v1_1-xxl", ""),
    ("black-forest-labs/FLUX.1-dev", "tokenizer_2"),
    ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
)


# --- T5 tokenizer -------------------------------------------------------------------------------


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
            "same tokenizer (FLUX.1's tokenizer_2/ has one) or pip install sentencepiece"
        )
    raise ModelError(f"{folder} lacks tokenizer.json (the T5 tokenizer); {fix}")


def find_t5_tokenizer_folder(
    t5_tokenizer_path: str | None, cache_dir: str | None, hub_cache: str | Path | None = None
) -> Path | None:
    """The first local folder with a T5 tokenizer: ``t5_tokenizer_path`` (or its tokenizer_2/),
    else kohya's ``tokenizer_cache_dir`` layout, else the Hugging Face cache. Never downloads."""

    def usable(folder: Path) -> bool:
        return (folder / "tokenizer.json").is_file() or (folder / "spiece.model").is_file()

    if t5_tokenizer_path:
        root = Path(t5_tokenizer_path).expanduser()
        found = [f for f in (root / "tokenizer_2", root) if usable(f)]
        return found[0] if found else None  # an explicit path that does not fit is reported
    if cache_dir:
        for repo, _sub in _T5_REPOS:
            folder = Path(cache_dir).expanduser() / repo.replace("/", "_")
            if usable(folder):
                return folder
    return hub_t5_tokenizer_folder(_T5_REPOS, hub_cache)


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


def load_t5_tokenizer(folder: Path, config: Mapping, source: TokenizerSource):
    """The T5 tokenizer in ``folder``, checked against T5-XXL's ``config`` (kind, vocabulary,
    end and padding ids)."""
    from transformers import T5TokenizerFast

    kind = encoder_kind(config, "t5")
    check_folder_kind(folder, kind, "T5-XXL", source)
    needs = "tokenizer.json (as FLUX.1's tokenizer_2/ has)"
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


def missing_t5_tokenizer(path_text: str | None, model_file: Path) -> str:
    if path_text:
        return (
            f"t5_tokenizer_path {path_text} has no tokenizer.json (nor a tokenizer_2/ subfolder "
            "with one); copy the T5 tokenizer files of a FLUX.1 diffusers folder's tokenizer_2/ "
            "there"
        )
    return (
        f"{model_file.name} carries no T5 tokenizer and none was found locally: set "
        "t5_tokenizer_path in [flow] to a folder with tokenizer.json (a FLUX.1 diffusers "
        "folder's tokenizer_2/, or google/t5-v1_1-xxl's files); tokenizer_cache_dir and the "
        "Hugging Face cache were searched too, nothing is downloaded"
    )
