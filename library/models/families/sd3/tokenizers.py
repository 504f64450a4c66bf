"""SD3's T5 tokenizer, found offline: ``t5_tokenizer_path`` (or its tokenizer_3/, as an SD3
diffusers folder has it), else where T5-XXL's is looked for beside single files
(text_encoders/t5.py's T5_XXL_PLACES), else the SD3 repositories' tokenizer_3/ in the Hugging
Face cache."""

from __future__ import annotations

from pathlib import Path

from library.models.text_encoders.t5 import T5_XXL_PLACES, hub_t5_tokenizer_folder

find_t5_tokenizer_folder = T5_XXL_PLACES.find

# Diffusers repositories whose tokenizer_3/ is SD3's T5 tokenizer, for the Hub cache.
_T5_REPOS = (
    ("stabilityai/stable-diffusion-3.5-large", "tokenizer_3"),
    ("stabilityai/stable-diffusion-3.5-medium", "tokenizer_3"),
    ("stabilityai/stable-diffusion-3-medium-diffusers", "tokenizer_3"),
)


def _has_t5_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "spiece.model").is_file()


def find_sd3_t5_tokenizer_folder(
    t5_tokenizer_path: str | None, cache_dir: str | None, hub_cache: str | Path | None = None
) -> Path | None:
    """The first local folder with a T5 tokenizer: ``t5_tokenizer_path`` (or its tokenizer_3/,
    as an SD3 diffusers folder has it), else where FLUX.1's is looked for (kohya's
    ``tokenizer_cache_dir``, the Hugging Face cache), else the SD3 repositories' tokenizer_3/ in
    the Hugging Face cache. Never downloads."""
    if t5_tokenizer_path:
        sub = Path(t5_tokenizer_path).expanduser() / "tokenizer_3"
        if _has_t5_tokenizer(sub):
            return sub
        return find_t5_tokenizer_folder(t5_tokenizer_path, cache_dir, hub_cache)
    found = find_t5_tokenizer_folder(None, cache_dir, hub_cache)
    return found or hub_t5_tokenizer_folder(_T5_REPOS, hub_cache)


def missing_t5_tokenizer(path_text: str | None, model_file: Path) -> str:
    if path_text:
        return (
            f"t5_tokenizer_path {path_text} has no tokenizer.json (nor a tokenizer_3/ or "
            "tokenizer_2/ subfolder with one); copy the T5 tokenizer files of an SD3 diffusers "
            "folder's tokenizer_3/ there"
        )
    return (
        f"{model_file.name} carries no T5 tokenizer and none was found locally: set "
        "t5_tokenizer_path in [flow] to a folder with tokenizer.json (an SD3 diffusers folder's "
        "tokenizer_3/, or google/t5-v1_1-xxl's files); tokenizer_cache_dir and the Hugging Face "
        "cache were searched too, nothing is downloaded"
    )
