"""musubi-tuner's Z-Image options that difftune knows by name and does not implement (its
entry's kohya vocabulary; library.config.musubi_args has the words all its trainers share)."""

from __future__ import annotations

from library.config.unsupported import Unsupported

OPTIONS: dict[str, Unsupported] = {
    "use_32bit_attention": Unsupported(
        "float32 attention inside a mixed-precision Z-Image transformer is not supported; "
        'mixed_precision = "no" computes every layer in float32',
        (False,),
        planned=False,
    ),
}
