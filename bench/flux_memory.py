"""Memory of the full-size FLUX.1 models and of LoRA training on them, computed on the meta device.

    python bench/flux_memory.py                          # FLUX.1 dev, ranks 4 ... 128, markdown
    python bench/flux_memory.py --variant schnell --dims 16 32 --no-markdown

Not a test and not timed in CI. Nothing is downloaded and no weight memory is allocated: every
component is built from library/models/families/flux/shapes.py on ``torch.device("meta")``, which
gives parameters their shapes and dtypes but no storage, and the figures are sums over those shapes.
It prints three tables, meant to be pasted into the docs:

1. each component's parameter count and bytes at bf16, and for the transformer and T5-XXL at
   float8 storage (fp8_base): nn.Linear weights at 1 byte except T5's feed-forward output
   layers (library/models/float8.py keeps them), every other parameter (Linear biases, norms,
   embeddings) kept at bf16;
2. the transformer LoRA of kohya's default targets (library/models/families/flux/lora_keys.py
   ``transformer_modules``) per rank: the parameters difftune trains, the count kohya's own
   fused layout would have, and the size of the file difftune writes, at bf16 and fp32;
3. a lower bound of LoRA training memory on the device, bf16 base vs fp8 base: frozen weights,
   float32 adapter weights, their float32 gradients and AdamW's two float32 states. Activations
   are not included.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

import torch  # noqa: E402
from torch import nn  # noqa: E402

from library.models.families.flux import shapes  # noqa: E402
from library.models.families.flux.lora_keys import KohyaModule, transformer_modules  # noqa: E402
from library.models.float8 import KEPT_SUFFIXES as FLOAT8_KEPT  # noqa: E402

GIB = 1024**3
MIB = 1024**2
DEFAULT_DIMS = (4, 8, 16, 32, 64, 128)
BF16, FP8, FP32 = 2, 1, 4  # bytes per element
# Per trained float32 adapter weight: the weight, its gradient, AdamW's exp_avg and exp_avg_sq.
TRAINED_BYTES = FP32 + FP32 + 2 * FP32


@dataclass(frozen=True)
class Component:
    """Parameter counts of one model, split the way float8 storage treats them."""

    name: str
    params: int
    linear_weights: int  # stored at 1 byte under fp8_base
    kept: dict[str, int]  # the other parameters, by kind, which fp8_base leaves at bf16

    def bf16_bytes(self) -> int:
        return self.params * BF16

    def fp8_bytes(self) -> int:
        return self.linear_weights * FP8 + (self.params - self.linear_weights) * BF16


def build_components(variant: shapes.Variant) -> dict[str, nn.Module]:
    """The four FLUX.1 components at full size, on the meta device."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    with torch.device("meta"):
        return {
            f"transformer ({variant})": FluxTransformer2DModel(
                **shapes.transformer_config(variant)
            ),
            "T5-XXL encoder": T5EncoderModel(T5Config(**shapes.t5_xxl_config())),
            "CLIP-L text": CLIPTextModel(CLIPTextConfig(**shapes.clip_l_config())),
            "AE": AutoencoderKL(**shapes.ae_config()),
        }


def count_component(name: str, model: nn.Module) -> Component:
    """Counts of ``model``'s parameters: all, nn.Linear weights, and the rest by kind."""
    linear_weights = 0
    kept: Counter[str] = Counter()
    seen: set[int] = set()
    for path, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            # T5's encoder.embed_tokens is the same Parameter as ``shared``: count it once, as
            # model.parameters() does; it is one tensor in memory.
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, nn.Linear) and path.endswith(FLOAT8_KEPT):
                kept["Linear kept (T5 wo)"] += param.numel()
            elif isinstance(module, nn.Linear) and param_name == "weight":
                linear_weights += param.numel()
            elif isinstance(module, nn.Linear):
                kept["Linear bias"] += param.numel()
            else:
                kept[type(module).__name__] += param.numel()
    params = sum(p.numel() for p in model.parameters())
    assert params == linear_weights + sum(kept.values()), name
    return Component(name, params, linear_weights, dict(kept))


@dataclass(frozen=True)
class LoraCounts:
    """Parameter counts of the transformer LoRA at one rank."""

    dim: int
    modules: int  # kohya modules (names in the file)
    linears: int  # diffusers Linears with an adapter
    trained: int  # difftune's adapters: r * (in + out) per diffusers Linear
    kohya_fused: int  # kohya's own layout: r * (in + sum out) per kohya module
    stored: int  # difftune's file: stacked down n*r x in, block-diagonal up sum(out) x n*r

    def file_bytes(self, element_bytes: int) -> int:
        """Tensor data of difftune's file; each module's alpha is a float32 scalar."""
        return self.stored * element_bytes + self.modules * FP32

    def kohya_file_bytes(self, element_bytes: int) -> int:
        return self.kohya_fused * element_bytes + self.modules * FP32


def lora_counts(modules: list[KohyaModule], dim: int) -> LoraCounts:
    """LoRA parameter counts of rank ``dim`` on every part of ``modules``."""
    trained = kohya_fused = stored = 0
    for module in modules:
        n, rows = len(module.parts), sum(module.out_features)
        # difftune adapts each diffusers Linear on its own: n downs [r, in] and n ups [out_i, r].
        trained += n * dim * module.in_features + dim * rows
        # kohya trains a fused layer (qkv, linear1) as one Linear: one down [r, in], one up
        # [sum out, r]. Its parts share that down, so kohya's count is (n - 1) * r * in below
        # difftune's, whose parts each have their own; the rank per part is the same.
        kohya_fused += dim * (module.in_features + rows)
        # kohya's format has one (down, up) per fused layer, so difftune writes its n adapters
        # as down [n r, in] (stacked) and up [sum out, n r] (block-diagonal): the same product,
        # but the zeros off the diagonal are stored too, (n - 1) * r * sum(out) of them.
        stored += n * dim * (module.in_features + rows)
    return LoraCounts(
        dim=dim,
        modules=len(modules),
        linears=sum(len(m.parts) for m in modules),
        trained=trained,
        kohya_fused=kohya_fused,
        stored=stored,
    )


# --- printing ---------------------------------------------------------------------------------


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def mib(n: int) -> str:
    return f"{n / MIB:.1f}"


def short_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.3f} B"
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.1f} K"


def table(header: list[str], rows: list[list[str]], markdown: bool, text_columns: int = 1) -> str:
    """Columns aligned in the text; a markdown table, or plain columns without the pipes.

    The first column and the last ``text_columns - 1`` are left-aligned text, the others
    right-aligned figures.
    """
    count = len(header)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(count)]
    left = [i == 0 or i >= count - (text_columns - 1) for i in range(count)]

    def line(cells: list[str]) -> str:
        padded = [
            cell.ljust(w) if is_left else cell.rjust(w)
            for cell, w, is_left in zip(cells, widths, left, strict=True)
        ]
        return "| " + " | ".join(padded) + " |" if markdown else "  ".join(padded).rstrip()

    if markdown:
        rule = (
            "|"
            + "|".join(
                "-" * (w + 2) if is_left else "-" * (w + 1) + ":"
                for w, is_left in zip(widths, left, strict=True)
            )
            + "|"
        )
    else:
        rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def bold(text: str, markdown: bool) -> str:
    return f"**{text}**" if markdown else text.upper()


def heading(text: str, markdown: bool) -> str:
    return f"### {text}" if markdown else f"{text}\n{'=' * len(text)}"


def kept_text(kept: dict[str, int]) -> str:
    return ", ".join(
        f"{kind} {short_count(n)}" for kind, n in sorted(kept.items(), key=lambda x: -x[1])
    )


def components_section(components: list[Component], markdown: bool) -> str:
    rows = []
    for c in components:
        fp8 = c.name.startswith(("transformer", "T5"))
        rows.append(
            [
                c.name,
                f"{c.params:,}",
                gib(c.bf16_bytes()),
                gib(c.fp8_bytes()) if fp8 else "-",
                kept_text(c.kept) if fp8 else "-",
            ]
        )
    header = ["component", "parameters", "bf16 GiB", "fp8 GiB", "kept at bf16 under fp8"]
    notes = (
        "fp8 = float8 storage (fp8_base): nn.Linear weights at 1 byte except T5's feed-forward output (wo), every other parameter "
        "at bf16 (2 bytes).\nCLIP-L and the AE are shown at bf16 only. GiB = 2^30 bytes."
    )
    return "\n\n".join(
        [
            heading("FLUX.1 components (full size)", markdown),
            table(header, rows, markdown, text_columns=2),
            notes,
        ]
    )


def lora_section(counts: list[LoraCounts], markdown: bool) -> str:
    rows = [
        [
            str(c.dim),
            f"{c.trained:,}",
            f"{c.kohya_fused:,}",
            f"{c.stored:,}",
            mib(c.file_bytes(BF16)),
            mib(c.file_bytes(FP32)),
            mib(c.kohya_file_bytes(BF16)),
        ]
        for c in counts
    ]
    header = [
        "network_dim",
        "trained params",
        "kohya fused params",
        "stored params",
        "file bf16 MiB",
        "file fp32 MiB",
        "kohya file bf16 MiB",
    ]
    first = counts[0]
    notes = (
        f"kohya's default targets: {first.modules} modules (every Linear of the "
        f"{shapes.NUM_DOUBLE_BLOCKS} double and {shapes.NUM_SINGLE_BLOCKS} single blocks, "
        f"modulation included), {first.linears} diffusers Linears.\n"
        "trained params: difftune's adapters, one per diffusers Linear, r * (in + out) each.\n"
        "kohya fused params: kohya's own LoRA, one adapter per fused layer (qkv, linear1), "
        "r * (in + sum out).\n"
        "stored params: difftune's file in kohya's format, a fused layer of n parts as down "
        "[n r, in] and block-diagonal up [sum out, n r] (zeros included).\n"
        "File sizes are tensor data plus a float32 alpha per module; the safetensors header "
        f"({3 * first.modules} tensor entries) adds about 0.1 MiB, training metadata a "
        "little more."
    )
    return "\n\n".join(
        [
            heading("Transformer LoRA (kohya's default targets)", markdown),
            table(header, rows, markdown),
            notes,
        ]
    )


def memory_section(
    transformer: Component, encoders: list[Component], counts: list[LoraCounts], markdown: bool
) -> str:
    base_bf16, base_fp8 = transformer.bf16_bytes(), transformer.fp8_bytes()
    rows = [
        [
            str(c.dim),
            gib(c.trained * TRAINED_BYTES),
            gib(base_bf16 + c.trained * TRAINED_BYTES),
            gib(base_fp8 + c.trained * TRAINED_BYTES),
        ]
        for c in counts
    ]
    header = ["network_dim", "adapter + grads + AdamW GiB", "bf16 base GiB", "fp8 base GiB"]
    # Text encoders and AE stay resident when their outputs are not cached; T5 is the one worth
    # storing in float8 (CLIP-L and the AE are small).
    resident_bf16 = sum(c.bf16_bytes() for c in encoders)
    resident_fp8 = sum(
        c.fp8_bytes() if c.name.startswith("T5") else c.bf16_bytes() for c in encoders
    )
    notes = (
        "Lower bound of device memory for training the LoRA: the frozen transformer "
        f"({gib(base_bf16)} GiB at bf16, {gib(base_fp8)} GiB at fp8) plus "
        f"{TRAINED_BYTES} bytes per trained adapter parameter (float32 weight, float32 gradient, "
        "AdamW's exp_avg and exp_avg_sq in float32).\n"
        f"{bold('Activations are not included', markdown)}, nor the CUDA context, allocator "
        "fragmentation, autocast copies of the adapters, or fp8 layers' temporary upcasts.\n"
        "With text-encoder outputs and latents cached, nothing else needs to be on the device; "
        f"otherwise add T5-XXL + CLIP-L + AE: {gib(resident_bf16)} GiB at bf16, "
        f"{gib(resident_fp8)} GiB with T5 at fp8."
    )
    return "\n\n".join(
        [
            heading("LoRA training memory, lower bound (no activations)", markdown),
            table(header, rows, markdown),
            notes,
        ]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dims", type=int, nargs="+", default=list(DEFAULT_DIMS), help="LoRA ranks (network_dim)"
    )
    parser.add_argument("--variant", default="dev", choices=shapes.VARIANTS)
    parser.add_argument(
        "--markdown",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print markdown tables (default); --no-markdown prints plain columns",
    )
    args = parser.parse_args(argv)
    if any(d < 1 for d in args.dims):
        parser.error("--dims must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    models = build_components(args.variant)
    components = [count_component(name, model) for name, model in models.items()]
    transformer, encoders = components[0], components[1:]
    modules = transformer_modules(models[transformer.name])
    counts = [lora_counts(modules, dim) for dim in args.dims]
    print(
        "\n\n".join(
            [
                components_section(components, args.markdown),
                lora_section(counts, args.markdown),
                memory_section(transformer, encoders, counts, args.markdown),
            ]
        )
    )


if __name__ == "__main__":
    main()
