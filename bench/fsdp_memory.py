"""Per-GPU memory of the denoiser's weights and trained state with and without fsdp, computed.

    python bench/fsdp_memory.py                 # 2, 4 and 8 GPUs, markdown
    python bench/fsdp_memory.py --gpus 8 --no-markdown

Not a test and not timed in CI; nothing is downloaded. The full-size SDXL UNet (from the shipped
config, library/models/configs/sdxl-base) and FLUX.1 [dev] transformer
(library/models/families/flux/shapes.py) are built on the meta device (shapes, no storage), and the
figures come from the trainer's own memory estimate (library/training/memory_estimate.py): the
weights one GPU holds at the step's peak (denoiser_weight_bytes: a 1/N slice plus what is gathered
at once) and, for full fine-tuning with AdamW and float32 trained weights, gradients and AdamW's two
moments (12 bytes per parameter, sharded 1/N under fsdp; DDP keeps a second gradient copy in its
buckets). Activations, text encoders and the VAE are not included: they do not change with
fsdp. A LoRA's own trained state is megabytes; for LoRA runs only the frozen weights matter.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()

import torch  # noqa: E402

from library.training.memory_estimate import denoiser_weight_bytes, module_bytes  # noqa: E402

GIB = 1024**3
MODES = ("no", "shard_grad_op", "full_shard")
FP32_GRAD, ADAM = 4, 8  # bytes per float32 trained parameter: its gradient, AdamW's moments


def sdxl_unet() -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    config = json.loads((REPO / "library/models/configs/sdxl-base/unet.json").read_text())
    with torch.device("meta"):
        return UNet2DConditionModel.from_config(config)


def flux_transformer() -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    from library.models.families.flux import shapes

    with torch.device("meta"):
        return FluxTransformer2DModel(**shapes.transformer_config("dev")).to(torch.bfloat16)


def per_gpu(model: torch.nn.Module, mode: str, gpus: int, full_finetune: bool) -> int:
    """Bytes on one GPU: weights at the peak, plus gradients and AdamW state when every
    parameter trains (float32)."""
    config = SimpleNamespace(training=SimpleNamespace(fsdp=mode))
    total = denoiser_weight_bytes(config, model, gpus)
    if full_finetune:
        numel = sum(p.numel() for p in model.parameters())
        if mode == "no":
            total += numel * (2 * FP32_GRAD + ADAM)  # the gradient and DDP's bucket copy
        else:
            total += -(-numel * (FP32_GRAD + ADAM) // gpus)
    return total


def rows(gpus: list[int]) -> list[list[str]]:
    cases = [
        ("SDXL UNet, full fine-tune (fp32 weights, AdamW)", sdxl_unet(), True),
        ("FLUX.1 [dev] transformer, LoRA (bf16 frozen weights)", flux_transformer(), False),
    ]
    out = []
    for name, model, full in cases:
        for n in gpus:
            cells = [f"{per_gpu(model, mode, n, full) / GIB:.1f} GiB" for mode in MODES]
            out.append([name, str(n), *cells])
        size = module_bytes(model) / GIB
        print(f"{name}: weights {size:.1f} GiB", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--no-markdown", action="store_true", help="plain columns")
    args = parser.parse_args(argv)
    header = ["denoiser", "GPUs", *(f"fsdp = {m}" for m in MODES)]
    table = rows(args.gpus)
    if args.no_markdown:
        for line in [header, *table]:
            print("  ".join(line))
        return
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for line in table:
        print("| " + " | ".join(line) + " |")


if __name__ == "__main__":
    main()
