"""Where FLUX.1's T5-XXL tokenizer is found (its CLIP-L tokenizer is found as SD's): the shared
T5 tokenizer reader (library/models/text_encoders/t5.py) with FLUX.1's places: ``t5_tokenizer_path``
(or its tokenizer_2/), else google/t5-v1_1-xxl or a FLUX.1 repository's tokenizer_2/ in kohya's
``tokenizer_cache_dir`` or the local Hugging Face cache; nothing is downloaded.
"""

from __future__ import annotations

from library.models.text_encoders.t5 import T5_XXL_REPO, T5TokenizerPlaces

T5_PLACES = T5TokenizerPlaces(
    repos=(
        T5_XXL_REPO,
        ("black-forest-labs/FLUX.1-dev", "tokenizer_2"),
        ("black-forest-labs/FLUX.1-schnell", "tokenizer_2"),
    ),
    sub="tokenizer_2",
    copy_from="a FLUX.1 diffusers folder's tokenizer_2/, or google/t5-v1_1-xxl's files",
)
find_t5_tokenizer_folder = T5_PLACES.find
missing_t5_tokenizer = T5_PLACES.missing
