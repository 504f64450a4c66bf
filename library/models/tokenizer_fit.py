"""Whether a tokenizer belongs to its text encoder, checked before any weight is read.

A tokenizer of another kind loads without complaint (transformers rebuilds a CLIP tokenizer
around a T5 vocabulary) and trains on meaningless token ids; ids past the encoder's embedding
rows stop the first step with an IndexError; an end token other than the one the encoder pools
at conditions on the wrong position. So each tokenizer is checked against its encoder's config
(``model_type``, ``vocab_size``, the special-token ids): its kind from the folder's files before
it is read, its size and special tokens after. Configs and tokenizer files are all it needs, so
the dry run checks the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from library.errors import ModelError

TokenizerKind = Literal["clip", "t5"]
_CLASSES = {"CLIPTokenizer": "clip", "T5Tokenizer": "t5"}
_KIND_NAMES = {"clip": "a CLIP tokenizer", "t5": "a T5 tokenizer"}
# transformers' defaults where an encoder config leaves an id out (CLIPTextConfig, T5Config).
_DEFAULT_IDS = {
    "clip": {"bos_token_id": 49406, "eos_token_id": 49407},
    "t5": {"eos_token_id": 1, "pad_token_id": 0},
}
# transformers pools a CLIP encoder whose config says eos_token_id = 2 (the ids published with
# OpenAI's and OpenCLIP's configs) at the highest token id of each caption, not at an id.
_LEGACY_CLIP_EOS = 2


@dataclass(frozen=True)
class TokenizerSource:
    """Where a tokenizer came from, for messages: ``key`` is the config key that chose it (or
    pretrained_model_name_or_path for a model folder's own), ``fix`` what to do about it."""

    key: str
    fix: str

    @classmethod
    def chosen(
        cls, folder: Path, key: str, given: str | None, cache_dir: str | None, files: str, seen_for: str = ""
    ) -> TokenizerSource:
        """The key that chose ``folder``: ``key`` (tokenizer_path, t5_tokenizer_path) when it is
        ``given``, tokenizer_cache_dir when the folder lies there, else the Hugging Face cache
        (found ``seen_for`` an encoder); ``files`` names what the right folder holds."""
        if given:
            return cls(key, f"point {key} at a folder with {files}")
        if cache_dir and Path(cache_dir).expanduser() in folder.parents:
            fix = f"replace {folder} with {files}, or set {key} to a folder with those files"
            return cls("tokenizer_cache_dir", fix)
        return cls(
            "pretrained_model_name_or_path",
            f"it was found in the Hugging Face cache{seen_for}; set {key} to a folder with {files}",
        )


def encoder_kind(config: Mapping, default: TokenizerKind) -> TokenizerKind:
    """The tokenizer kind an encoder takes: by its config's ``model_type`` (a diffusers folder's
    config.json has one), else ``default`` (the encoder's place in the family)."""
    model_type = str(config.get("model_type") or "")
    if model_type.startswith(("t5", "umt5")):
        return "t5"
    if model_type.startswith("clip"):
        return "clip"
    return default


def check_folder_kind(folder: Path, kind: TokenizerKind, encoder: str, source: TokenizerSource):
    """ModelError when ``folder``'s files say it holds another kind of tokenizer than ``kind``
    (read before the tokenizer is: transformers would load it as the wrong class silently)."""
    found, evidence = _folder_kind(folder)
    if found is None or found == kind:
        return
    what = _KIND_NAMES.get(found, f"a {found}")
    raise _not_its_tokenizer(
        folder, encoder, f"it is {what} ({evidence}), and {encoder} takes {_KIND_NAMES[kind]}",
        source,
    )  # fmt: skip


def check_tokenizer(
    tokenizer, folder: Path, config: Mapping, kind: TokenizerKind, encoder: str,
    source: TokenizerSource,
) -> None:  # fmt: skip
    """ModelError when the loaded ``tokenizer`` does not fit the encoder ``config``: more ids
    than embedding rows, or special-token ids other than the ones the encoder works with."""
    rows = config.get("vocab_size")
    if isinstance(rows, int) and len(tokenizer) > rows:
        raise _not_its_tokenizer(
            folder, encoder,
            f"it has {len(tokenizer)} tokens and {encoder} {rows} embedding rows (ids past "
            "them would fail at the first step)",
            source,
        )  # fmt: skip
    problem = _clip_ids(tokenizer, config) if kind == "clip" else _t5_ids(tokenizer, config)
    if problem:
        raise _not_its_tokenizer(folder, encoder, problem, source)


def _config_id(config: Mapping, kind: TokenizerKind, name: str) -> int | None:
    value = config.get(name, _DEFAULT_IDS[kind].get(name))
    return value if isinstance(value, int) else None


def _clip_ids(tokenizer, config: Mapping) -> str | None:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos is None or pad is None:
        return "it has no end or padding token"
    wanted = _config_id(config, "clip", "eos_token_id")
    if wanted == _LEGACY_CLIP_EOS:
        highest = max(tokenizer.get_vocab().values())
        if eos != highest:
            return (
                f"its end token {tokenizer.eos_token!r} is id {eos}, and the encoder (its config "
                f"says eos_token_id = 2) pools at the highest id, {highest}"
            )
        return None
    if wanted is not None and eos != wanted:
        token = repr(tokenizer.eos_token)
        return f"its end token {token} is id {eos}, the encoder's eos_token_id {wanted}"
    # The padding token is not compared: OpenCLIP pads with "!" (id 0) whatever its config says,
    # and CLIP's output at the end token does not depend on it.
    bos, wanted = tokenizer.bos_token_id, _config_id(config, "clip", "bos_token_id")
    if bos is not None and wanted is not None and bos != wanted:
        token = repr(tokenizer.bos_token)
        return f"its start token {token} is id {bos}, the encoder's bos_token_id {wanted}"
    return None


def _t5_ids(tokenizer, config: Mapping) -> str | None:
    for name, got in (("eos", tokenizer.eos_token_id), ("pad", tokenizer.pad_token_id)):
        wanted = _config_id(config, "t5", f"{name}_token_id")
        if got is None:
            return f"it has no {'end' if name == 'eos' else 'padding'} token"
        if wanted is not None and got != wanted:
            token = getattr(tokenizer, f"{name}_token")
            return f"its {name} token {token!r} is id {got}, the encoder's {name}_token_id {wanted}"
    return None


def _not_its_tokenizer(folder: Path, encoder: str, problem: str, source: TokenizerSource):
    return ModelError(
        f"{source.key}: the tokenizer in {folder} does not fit {encoder}: {problem}; {source.fix}"
    )


def _folder_kind(folder: Path) -> tuple[str | None, str]:
    """The kind of tokenizer ``folder``'s files hold ("clip", "t5", or another tokenizer class
    name) and the file that says so; None when the files do not tell."""
    cls = _json_value(folder / "tokenizer_config.json", ("tokenizer_class",))
    if isinstance(cls, str) and cls:
        name = cls.removesuffix("Fast")
        return _CLASSES.get(name, name), f"its tokenizer_config.json names {cls}"
    model = _json_value(folder / "tokenizer.json", ("model", "type"))
    if model == "Unigram":
        return "t5", "its tokenizer.json holds a SentencePiece (Unigram) vocabulary"
    if model == "WordPiece":
        return "WordPiece (BERT-style) tokenizer", "its tokenizer.json says so"
    has_bpe = (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    if (folder / "spiece.model").is_file() and not has_bpe:
        return "t5", "it has spiece.model"
    return None, ""


def _json_value(path: Path, keys: tuple[str, ...]) -> object:
    """The value at ``keys`` in a JSON file; None when the file or the value is not there (a
    broken file is reported by whatever reads it next)."""
    try:
        value: object = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
