"""The frozen denoiser's weights on the GPU at full size, per family and storage, computed.

    python bench/quantized_memory.py             # every family, markdown
    python bench/quantized_memory.py --swap 0 18

Not a test and not timed in CI; nothing is downloaded and no weight memory is allocated. Each
family's released denoiser is built from its shapes (library/models/configs, the families'
shapes.py) on ``torch.device("meta")`` in bf16, then stored as a LoRA run would store it: as it
is, with ``fp8_base`` (library/models/float8.py), or with ``base_model_precision`` nf4 (with and
without double quantization) or int8 (library/models/quantized_base.py); ``blocks_to_swap`` then
moves the family's last blocks to host memory (library/training/block_swap.py). The figures are
the trainer's own count (memory_estimate.module_bytes: parameters, buffers and quantized storage
on the device), which the dry run's estimate uses, plus the one layer's weight that a quantized
or swapped layer makes at a time (dequantized, or fetched from host memory and cast). Text encoders, the VAE, adapters and activations are not included.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

import torch  # noqa: E402

from library.config.flow_schema import FlowSection  # noqa: E402
from library.models.float8 import store_in_float8  # noqa: E402
from library.models.quantized_base import quantize_linears  # noqa: E402
from library.training.block_swap import swap_linears  # noqa: E402
from library.training.memory_estimate import dequantized_bytes, module_bytes  # noqa: E402

GIB = 1024**3
BF16 = torch.bfloat16
STORAGES = ("bf16", "fp8", "int8", "nf4", "nf4 + double quant")


def _sd_unet(folder: str):
    from diffusers import UNet2DConditionModel

    config = json.loads((REPO / "library/models/configs" / folder / "unet.json").read_text())
    return UNet2DConditionModel.from_config(config), None


def _flux():
    from diffusers import FluxTransformer2DModel

    from library.models.families.flux import shapes
    from library.models.families.flux.family import flux_family

    family = flux_family("dev", FlowSection())
    return FluxTransformer2DModel(**shapes.transformer_config("dev")), family


def _sd35():
    from diffusers import SD3Transformer2DModel

    from library.models.families.sd3 import shapes
    from library.models.families.sd3.family import sd3_family

    family = sd3_family("sd3.5-large", FlowSection())
    return SD3Transformer2DModel(**shapes.transformer_config("sd3.5-large")), family


def _chroma():
    from diffusers import ChromaTransformer2DModel

    from library.models.families.chroma import shapes
    from library.models.families.chroma.family import chroma_family

    return ChromaTransformer2DModel(**shapes.transformer_config()), chroma_family(FlowSection())


def _zimage():
    from diffusers import ZImageTransformer2DModel

    from library.models.families.zimage import shapes
    from library.models.families.zimage.family import zimage_family

    return ZImageTransformer2DModel(**shapes.transformer_config()), zimage_family("turbo", 3.0)


def _qwenimage():
    from diffusers import QwenImageTransformer2DModel

    from library.models.families.qwenimage import shapes
    from library.models.families.qwenimage.family import qwenimage_family

    return QwenImageTransformer2DModel(**shapes.transformer_config()), qwenimage_family()


DENOISERS = {
    "SD 1.5 UNet": lambda: _sd_unet("sd15"),
    "SDXL UNet": lambda: _sd_unet("sdxl-base"),
    "FLUX.1 [dev] / Kontext transformer": _flux,
    "SD3.5 Large transformer": _sd35,
    "Chroma transformer": _chroma,
    "Z-Image transformer": _zimage,
    "Qwen-Image (and Edit) transformer": _qwenimage,
}


def stored(build, storage: str, swap: int) -> int | None:
    """Bytes on the device of the denoiser in ``storage`` with ``swap`` blocks swapped (None:
    the family has no block swap)."""
    with torch.device("meta"):
        model, family = build()
    model = model.to(BF16).requires_grad_(False)
    if storage == "fp8":
        store_in_float8(model, BF16)
    elif storage != "bf16":
        precision = "int8" if storage == "int8" else "nf4"
        quantize_linears(model, precision, storage.endswith("quant"), BF16)
    if swap:
        if family is None or not hasattr(family, "swap_blocks"):
            return None
        try:
            blocks = family.swap_blocks(model, swap)
        except Exception:  # the family swaps no blocks of this model (SD)
            return None
        swap_linears(blocks)
    return module_bytes(model) + dequantized_bytes(model, BF16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--swap", type=int, nargs="+", default=[0, 18],
                        help="blocks_to_swap values (default 0 and 18)")  # fmt: skip
    args = parser.parse_args()
    print("Frozen denoiser weights on the GPU, GiB (bf16 compute)")
    print("| denoiser | blocks_to_swap | " + " | ".join(STORAGES) + " |")
    print("|---|---|" + "---|" * len(STORAGES))
    for name, build in DENOISERS.items():
        for swap in args.swap:
            cells = [stored(build, storage, swap) for storage in STORAGES]
            if all(c is None for c in cells):
                continue
            shown = ["-" if c is None else f"{c / GIB:.1f}" for c in cells]
            print(f"| {name} | {swap} | " + " | ".join(shown) + " |")


if __name__ == "__main__":
    main()
