"""musubi-tuner's Qwen-Image options that difftune knows by name and does not implement (its
entry's kohya vocabulary; library.config.musubi_args has the words all its trainers share)."""

from __future__ import annotations

from library.config.unsupported import Unsupported

OPTIONS: dict[str, Unsupported] = {
    # qwen_image_utils.add_model_version_args: the older switches for model_version
    "edit": Unsupported(
        'musubi-tuner\'s older switch for Qwen-Image-Edit; write model_version = "edit"',
        (False,),
        planned=False,
    ),
    "edit_plus": Unsupported(
        'musubi-tuner\'s older switch for Qwen-Image-Edit-2509; write model_version = "edit-2509"',
        (False,),
        planned=False,
    ),
    "remove_first_image_from_target": Unsupported(
        "only musubi-tuner's Qwen-Image-Layered training reads it (model_version = "
        '"layered", which is not supported)',
        (False,),
        ignored=True,
    ),
}
