"""The dry run's memory estimate of LoRA training at full size, on the meta device.

    python bench/lora_memory.py                          # Qwen-Image and FLUX.1 [dev]
    python bench/lora_memory.py --families flux --resolution 768 --swaps 0 18

Not a test and not timed in CI. Nothing is downloaded and no weight memory is allocated: each
family's transformer, text encoders and VAE are built from its shapes.py on
``torch.device("meta")``, its preset (configs/qwenimage_lora.toml, configs/flux_lora.toml) is
read with the options each row names, and the figures are those of ``estimate_peak_memory``,
what ``--dry_run`` prints and checks against the device. Captions are shaped by the tiny test
tokenizers (an empty caption, as the estimate draws it, is the prompt template's tokens, or
T5's padded length, with either tokenizer).

Rows: bf16 base; ``fp8_base`` (the frozen Linear weights of the transformer and the text
encoders in float8); ``blocks_to_swap`` of the transformer's blocks kept in host memory; the
transformer quantized (``base_model_precision``) with the text encoders in float8.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import tomllib
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

import torch  # noqa: E402

from library.config.loader import load_config  # noqa: E402
from library.models.loader import Components  # noqa: E402
from library.training.memory_estimate import estimate_peak_memory  # noqa: E402
from library.training.setup import WEIGHT_DTYPES, setup_training  # noqa: E402

GIB = 1024**3
ASSETS = REPO / "tests" / "assets"  # the tiny test tokenizers (tools/make_test_assets.py)


def qwenimage_components(config, folder: Path) -> Components:
    """Qwen-Image at full size on the meta device, frozen, in the config's weight dtype."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from library.models.families.qwenimage import shapes
    from library.models.families.qwenimage.family import qwenimage_family
    from library.models.families.qwenimage.objective import (
        QwenImageFlowObjective,
        qwenimage_flow_options,
    )
    from library.models.families.qwenimage.tiny_tokenizer import write_tiny_qwen25vl_tokenizer

    with torch.device("meta"):
        transformer = QwenImageTransformer2DModel(**shapes.transformer_config())
        vae = AutoencoderKLQwenImage(**shapes.vae_config())
        text = Qwen2_5_VLForConditionalGeneration(
            Qwen2_5_VLConfig(**shapes.text_encoder_config())
        )
    tokenizer = _tokenizer(write_tiny_qwen25vl_tokenizer(folder / "qwen"))
    objective = QwenImageFlowObjective(
        qwenimage_flow_options(config.flow), shapes.scheduler_config()
    )
    return _frozen(config, transformer, vae, (text,), (tokenizer,), objective, qwenimage_family())


def flux_components(config, folder: Path) -> Components:
    """FLUX.1 [dev] at full size on the meta device, frozen, in the config's weight dtype."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from library.models.families.flux import shapes
    from library.models.families.flux.family import flux_family
    from library.models.families.flux.sampling import flux_scheduler_config
    from library.training.objectives import FlowMatchingObjective, FlowOptions

    with torch.device("meta"):
        transformer = FluxTransformer2DModel(**shapes.transformer_config("dev"))
        vae = AutoencoderKL(**shapes.ae_config())
        clip = CLIPTextModel(CLIPTextConfig(**shapes.clip_l_config()))
        t5 = T5EncoderModel(T5Config(**shapes.t5_xxl_config()))
    tokenizers = (_tokenizer(ASSETS / "tokenizer"), _tokenizer(ASSETS / "t5_tokenizer"))
    objective = FlowMatchingObjective(
        FlowOptions.from_section(config.flow), flux_scheduler_config("dev")
    )
    family = flux_family("dev", config.flow)
    return _frozen(config, transformer, vae, (clip, t5), tokenizers, objective, family)


def _frozen(config, transformer, vae, texts, tokenizers, objective, family) -> Components:
    dtype = WEIGHT_DTYPES[config.training.mixed_precision]
    for module in (transformer, *texts):
        module.to(dtype).requires_grad_(False).eval()
    vae.requires_grad_(False).eval()
    return Components(
        denoiser=transformer,
        vae=vae,
        text_encoders=texts,
        tokenizers=tokenizers,
        objective=objective,
        family=family,
        model_dir=REPO,
    )


# family -> (its preset, its components on the meta device, default blocks_to_swap rows)
FAMILIES = {
    "qwenimage": ("Qwen-Image", REPO / "configs" / "qwenimage_lora.toml", qwenimage_components,
                  [16, 24, 30, 45]),
    "flux": ("FLUX.1 [dev]", REPO / "configs" / "flux_lora.toml", flux_components, [18, 30]),
}  # fmt: skip


def preset_with(preset: Path, folder: Path, resolution: int, **training) -> object:
    """The preset read with ``training`` keys over its [training] table."""
    data = tomllib.loads(preset.read_text(encoding="utf-8"))
    data["training"].update(training)
    data["datasets"][0]["resolution"] = resolution
    data["datasets"][0]["subsets"][0]["image_dir"] = str(folder)
    lines = []
    for section, table in data.items():
        if section == "datasets":
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    dataset = data["datasets"][0]
    lines.append("[[datasets]]")
    lines += [f"{k} = {_toml(v)}" for k, v in dataset.items() if k != "subsets"]
    lines.append("[[datasets.subsets]]")
    lines += [f"{k} = {_toml(v)}" for k, v in dataset["subsets"][0].items()]
    path = folder / "run.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_config(str(path))


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def estimate(config, build, folder: Path, resolution: int):
    parts = setup_training(config, build(config, folder))
    dataset = SimpleNamespace(buckets=[], resolution=(resolution, resolution), batch_size=1)
    return estimate_peak_memory(
        config, parts, SimpleNamespace(datasets=[dataset]), 1, False, "cuda"
    )


def rows(swaps: list[int]) -> list[tuple[str, dict]]:
    """(label, [training] keys) of each row."""
    quantized = {"fp8_base": True, "bnb_4bit_use_double_quant": True,
                 "base_model_precision": "nf4-bnb"}  # fmt: skip
    return [
        ("bf16 base", {}),
        ("`fp8_base`", {"fp8_base": True}),
        *((f"`fp8_base`, `blocks_to_swap = {n}`", {"fp8_base": True, "blocks_to_swap": n})
          for n in swaps),
        ('`base_model_precision = "int8-bnb"`, `fp8_base`',
         {"fp8_base": True, "base_model_precision": "int8-bnb"}),
        ('`base_model_precision = "nf4-bnb"` (double quant), `fp8_base`', quantized),
        *((f"the same, `blocks_to_swap = {n}`", {**quantized, "blocks_to_swap": n})
          for n in swaps[:1]),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES),
                        default=list(FAMILIES))  # fmt: skip
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--swaps", type=int, nargs="+", default=None,
                        help="blocks_to_swap rows (default: per family)")  # fmt: skip
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the setup's notes about each row's options
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in args.families:
            label, preset, build, swaps = FAMILIES[name]
            print(f"\n{label} LoRA ({preset.relative_to(REPO)}), {args.resolution} x "
                  f"{args.resolution}, batch 1; GiB")  # fmt: skip
            print("| options | weights | adapters + optimizer | activations | peak |")
            print("|---|---|---|---|---|")
            for text, training in rows(args.swaps or swaps):
                config = preset_with(preset, folder, args.resolution, **training)
                found = estimate(config, build, folder, args.resolution)
                cells = (found.weights, found.trained_state, found.activations, found.total)
                print(f"| {text} | " + " | ".join(f"{c / GIB:.1f}" for c in cells) + " |")


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


if __name__ == "__main__":
    main()
