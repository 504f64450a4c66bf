"""A text encoder's tokenizer from the folder tokenizer_path names, for families read from single
files that carry none (Z-Image's Qwen3, Qwen-Image's Qwen2.5-VL), and the spec's tokenizer part
of the families that read theirs so (``tokenizer_part``). Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from library.errors import ModelError
from library.models.families.folder_loader import FolderTokenizer
from library.models.model_files import offline, one_line


def tokenizer_folder(tokenizer_path: str | None, model_file: Path, name: str, where: str) -> Path:
    """The folder of ``name``'s tokenizer: tokenizer_path, or its tokenizer/ subfolder (so a
    diffusers folder works as it is). ModelError when unset or not a folder; ``where`` says
    where users find the files."""
    if not tokenizer_path:
        raise ModelError(
            f"{model_file.name} carries no tokenizer: set tokenizer_path to a folder with {name}'s "
            f"tokenizer files (tokenizer.json or vocab.json and merges.txt, tokenizer_config.json; "
            f"{where}); nothing is downloaded"
        )
    folder = Path(tokenizer_path).expanduser().absolute()
    if (folder / "tokenizer").is_dir() and not (folder / "tokenizer_config.json").is_file():
        folder = folder / "tokenizer"
    if not folder.is_dir():
        raise ModelError(f"tokenizer_path {folder} is not a folder; set it to {name}'s tokenizer")
    return folder


def load_local_tokenizer(
    tokenizer_path: str | None, vocab_size: int | None, model_file: Path, name: str, where: str
):
    """``name``'s tokenizer from ``tokenizer_folder``; ModelError when it cannot be read or has
    more tokens than the encoder's ``vocab_size`` embeddings (when known)."""
    from transformers import AutoTokenizer

    folder = tokenizer_folder(tokenizer_path, model_file, name, where)
    with offline():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, TypeError) as exc:
            raise ModelError(
                f"tokenizer_path {folder}: cannot read a {name} tokenizer there ({one_line(exc)})"
            ) from None
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ModelError(
            f"tokenizer_path {folder} has {len(tokenizer)} tokens and the text encoder "
            f"{vocab_size} embeddings: it is not {name}'s tokenizer"
        )
    return tokenizer


def folder_or_path_tokenizer(model_dir: Path, tokenizer_path: str | None, name: str, where: str):
    """A diffusers folder's tokenizer/ (AutoTokenizer), or tokenizer_path's when it is set;
    ModelError naming the folder when it cannot be read."""
    from transformers import AutoTokenizer

    if tokenizer_path:
        return load_local_tokenizer(tokenizer_path, None, model_dir, name, where)
    folder = model_dir / "tokenizer"
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the {name} tokenizer in {folder}: {exc}") from None


def tokenizer_part(name: str, where: str, encoder: str = "text_encoder") -> FolderTokenizer:
    """A spec's ``tokenizer/``, read by AutoTokenizer: a folder's (``folder_or_path_tokenizer``)
    and, beside single files, tokenizer_path's, fitting the vocabulary of the ``encoder`` part
    (its ``text_config``'s for a vision-language model). ``name``: the tokenizer's kind in
    messages; ``where``: where users find its files."""

    def read(folder):
        return folder_or_path_tokenizer(folder.model_dir, folder.model.tokenizer_path, name, where)

    def read_files(checked):
        config = checked.part_config(encoder)
        vocab = config.get("text_config", config)["vocab_size"]
        return load_local_tokenizer(
            checked.model.tokenizer_path, vocab, checked.model_dir, name, where
        )

    return FolderTokenizer("tokenizer", read, read_files=read_files)
