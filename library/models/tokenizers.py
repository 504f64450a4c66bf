"""CLIP tokenizers: a model folder's own, or, for single-file checkpoints, which carry none (and
for a folder whose tokenizers ``tokenizer_path`` replaces), found locally, never downloaded.
Each is checked against its encoder's config before any weight is read
(library.models.tokenizer_fit).

Every SD text encoder (OpenAI CLIP-L, OpenCLIP ViT-H and ViT-bigG) uses the same BPE
vocabulary, so one set of CLIP tokenizer files (vocab.json + merges.txt) serves each of them.
They differ only in the padding token: OpenCLIP towers were trained padding with "!" (id 0),
OpenAI CLIP with the end token; ``load_tokenizer_for`` sets that from the encoder kind.

Where the files are looked for, first match wins, per text encoder:
1. ``tokenizer_path``: a folder with the files, or a diffusers-style folder with
   ``tokenizer/`` (and ``tokenizer_2/`` for SDXL's second encoder);
2. ``tokenizer_cache_dir``: kohya's cache layout, one folder per Hub repo with "/" -> "_"
   (``openai_clip-vit-large-patch14``, ``stabilityai_stable-diffusion-2``,
   ``laion_CLIP-ViT-bigG-14-laion2B-39B-b160k``);
3. the local Hugging Face cache (HF_HUB_CACHE), for the repos kohya and diffusers use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from library.errors import ModelError
from library.models.model_files import read_tokenizer
from library.models.tokenizer_fit import (
    TokenizerSource,
    check_folder_kind,
    check_tokenizer,
    encoder_kind,
)

log = logging.getLogger(__name__)

EncoderKind = Literal["clip", "openclip"]
OPENCLIP_PAD = "!"

# (repo id, subfolder) holding CLIP tokenizer files, most fitting first for each kind.
_CLIP_REPOS = (
    ("openai/clip-vit-large-patch14", ""),
    ("stable-diffusion-v1-5/stable-diffusion-v1-5", "tokenizer"),
    ("runwayml/stable-diffusion-v1-5", "tokenizer"),
    ("stabilityai/stable-diffusion-xl-base-1.0", "tokenizer"),
)
_OPENCLIP_REPOS = (
    ("stabilityai/stable-diffusion-2-1", "tokenizer"),
    ("stabilityai/stable-diffusion-2", "tokenizer"),
    ("stabilityai/stable-diffusion-2-1-base", "tokenizer"),
    ("laion/CLIP-ViT-bigG-14-laion2B-39B-b160k", ""),
    ("stabilityai/stable-diffusion-xl-base-1.0", "tokenizer_2"),
)


def repos_for(kind: EncoderKind) -> tuple[tuple[str, str], ...]:
    """Hub repos whose tokenizer fits ``kind``; the other kind's follow (same vocabulary)."""
    first, second = (
        (_CLIP_REPOS, _OPENCLIP_REPOS) if kind == "clip" else (_OPENCLIP_REPOS, _CLIP_REPOS)
    )
    return first + second


def has_tokenizer_files(folder: Path) -> bool:
    bpe = (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    return bpe or (folder / "tokenizer.json").is_file()


def find_tokenizer_folder(
    kind: EncoderKind,
    index: int,
    tokenizer_path: str | None,
    cache_dir: str | None,
    hub_cache: str | Path | None = None,
) -> Path | None:
    """The first local folder with tokenizer files for text encoder ``index`` (0 or 1)."""
    if tokenizer_path:
        root = Path(tokenizer_path).expanduser()
        sub = root / ("tokenizer" if index == 0 else "tokenizer_2")
        for folder in (sub, root):
            if has_tokenizer_files(folder):
                return folder
        return None  # an explicit path that does not fit is reported, not bypassed
    repos = repos_for(kind)
    if cache_dir:
        root = Path(cache_dir).expanduser()
        for repo, _sub in repos:
            folder = root / repo.replace("/", "_")
            if has_tokenizer_files(folder):
                return folder
    for repo, sub in repos:
        folder = _hub_cached_folder(repo, sub, hub_cache)
        if folder is not None:
            return folder
    return None


def _hub_cached_folder(repo: str, sub: str, hub_cache: str | Path | None) -> Path | None:
    """A snapshot folder of ``repo`` already in the local Hub cache; never a network call."""
    from huggingface_hub import try_to_load_from_cache

    name = f"{sub}/vocab.json" if sub else "vocab.json"
    try:
        found = try_to_load_from_cache(repo, name, cache_dir=hub_cache)
    except (OSError, ValueError):
        return None
    if not isinstance(found, str):
        return None
    folder = Path(found).parent
    return folder if has_tokenizer_files(folder) else None


def encoder_label(subfolder: str, count: int) -> str:
    """How messages name an SD model's text encoder ``subfolder`` of ``count``."""
    if count == 1:
        return "the text encoder"
    return "the second text encoder" if subfolder == "text_encoder_2" else "the first text encoder"


def load_clip_tokenizer(folder: Path, config: Mapping, encoder: str, source: TokenizerSource):
    """The CLIP tokenizer in ``folder``, checked against its encoder's ``config`` (kind,
    vocabulary, special tokens; library.models.tokenizer_fit), its length capped at the
    encoder's position table."""
    from transformers import CLIPTokenizer

    kind = encoder_kind(config, "clip")
    check_folder_kind(folder, kind, encoder, source)
    needs = "vocab.json and merges.txt (or tokenizer.json)"
    tokenizer = read_tokenizer(CLIPTokenizer, folder, needs)
    # A folder without tokenizer_config.json leaves model_max_length "unlimited"; the text
    # encoder's position table is the real limit (77 for SD and FLUX.1's CLIP-L).
    max_positions = config.get("max_position_embeddings", 77)
    if tokenizer.model_max_length > max_positions:
        tokenizer.model_max_length = max_positions
    check_tokenizer(tokenizer, folder, config, kind, encoder, source)
    return tokenizer


def load_tokenizer_for(
    kind: EncoderKind,
    index: int,
    model_file: Path,
    tokenizer_path: str | None,
    cache_dir: str | None,
    config: Mapping,
    encoder: str,
    hub_cache: str | Path | None = None,
):
    """A CLIPTokenizer for text encoder ``index`` (``encoder`` in messages) of a model that
    carries none; ModelError if none is found or it does not fit the encoder's ``config``.

    The tokenizer pads and truncates to the encoder's position table (77).
    """
    if tokenizer_path and Path(tokenizer_path).expanduser().is_file():
        raise ModelError(
            f"tokenizer_path {tokenizer_path} is a file; set it to the folder that holds "
            "vocab.json and merges.txt"
        )
    folder = find_tokenizer_folder(kind, index, tokenizer_path, cache_dir, hub_cache)
    if folder is None:
        raise ModelError(_missing_message(kind, index, model_file, tokenizer_path))
    files = "CLIP's vocab.json and merges.txt"
    source = TokenizerSource.chosen(
        folder, "tokenizer_path", tokenizer_path, cache_dir, files, f" for {encoder}"
    )
    tokenizer = load_clip_tokenizer(folder, config, encoder, source)
    if kind == "openclip" and tokenizer.pad_token != OPENCLIP_PAD:
        if OPENCLIP_PAD not in tokenizer.get_vocab():
            raise ModelError(f'the tokenizer in {folder} has no "{OPENCLIP_PAD}" token to pad with')
        tokenizer.pad_token = OPENCLIP_PAD
    log.info("text encoder %d of %s: tokenizer from %s", index + 1, model_file.name, folder)
    return tokenizer


def folder_tokenizer(
    model_dir: Path, sub: str, kind: EncoderKind, index: int, tokenizer_path: str | None,
    config: Mapping, encoder: str,
):  # fmt: skip
    """The CLIP tokenizer of text encoder ``index`` of the diffusers folder ``model_dir``: the
    one in its ``sub``/, or, when set, ``tokenizer_path``'s (which replaces the folder's)."""
    if tokenizer_path:
        return load_tokenizer_for(kind, index, model_dir, tokenizer_path, None, config, encoder)
    fix = f"{model_dir} must hold its text encoder's own tokenizer in {sub}/: restore it"
    source = TokenizerSource("pretrained_model_name_or_path", fix)
    return load_clip_tokenizer(model_dir / sub, config, encoder, source)


def _missing_message(kind: EncoderKind, index: int, model_file: Path, path: str | None) -> str:
    repo, sub = repos_for(kind)[0]
    files = f"{repo}{'/' + sub if sub else ''}"
    if path:
        where = "tokenizer/ or tokenizer_2/" if index else "tokenizer/"
        return (
            f"tokenizer_path {path} has no vocab.json + merges.txt (nor a {where} subfolder "
            f"with them); copy the tokenizer files of {files} there"
        )
    return (
        f"{model_file.name} carries no tokenizer and none was found locally: copy vocab.json and "
        f"merges.txt of {files} into a folder and set tokenizer_path to it (or set "
        f"tokenizer_cache_dir to a folder holding {repo.replace('/', '_')}/); the Hugging Face "
        "cache was searched too, nothing is downloaded"
    )
