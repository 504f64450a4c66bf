"""The tokenizers of FLUX.1: CLIP-L's (as for SD) and T5-XXL's (tokenizer.json), found offline.

T5's comes from ``t5_tokenizer_path``, else kohya's ``tokenizer_cache_dir``, else the local Hugging
Face cache (google/t5-v1_1-xxl, or a FLUX.1 repository's tokenizer_2/); nothing is downloaded.
Each tokenizer is checked against its encoder's vocabulary before any weight is read.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from library.errors import ModelError
from library.models.loader import load_clip_tokenizer, read_tokenizer

# (repo id, subfolder) whose T5 tokenizer fits FLUX.1, for tokenizer_cache_dir and the Hub cache.
_T5_REPOS = (
    ("google/t5-v1_1-xxl", ""),
    ("black-forest-labs/FLUX.1-dev", "tokenizer_2"),
    ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
)


def load_flux_clip_tokenizer(folder: Path, config: dict):
    """CLIP-L's tokenizer in ``folder``, checked against the encoder ``config``'s vocabulary."""
    tokenizer = load_clip_tokenizer(folder, config["max_position_embeddings"])
    check_vocab(folder, tokenizer, config["vocab_size"], "CLIP-L")
    return tokenizer


def check_vocab(folder: Path | str, tokenizer, rows: int, encoder: str) -> None:
    """A tokenizer with more ids than the encoder has embeddings is another model's."""
    if len(tokenizer) > rows:
        raise ModelError(
            f"the tokenizer in {folder} has {len(tokenizer)} tokens but the {encoder} encoder "
            f"only {rows} embeddings: it is not {encoder}'s tokenizer; point at the right folder"
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
    from huggingface_hub import try_to_load_from_cache

    for repo, sub in _T5_REPOS:
        for name in ("tokenizer.json", "spiece.model"):
            try:
                hit = try_to_load_from_cache(repo, f"{sub}/{name}" if sub else name, hub_cache)
            except (OSError, ValueError):
                hit = None
            if isinstance(hit, str):
                return Path(hit).parent
    return None


def load_t5_tokenizer(folder: Path, rows: int):
    from transformers import T5TokenizerFast

    needs = "tokenizer.json (as FLUX.1's tokenizer_2/ has)"
    tokenizer = read_tokenizer(T5TokenizerFast, folder, needs, "T5 tokenizer")
    check_vocab(folder, tokenizer, rows, "T5")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ModelError(
            f"the tokenizer in {folder} has no pad or end token; it is not T5's tokenizer"
        )
    # model_max_length stays as the folder says: the family decides how many tokens to use.
    return tokenizer


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
