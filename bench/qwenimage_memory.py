"""The dry run's memory estimate of Qwen-Image LoRA training at full size, on the meta device.

    python bench/qwenimage_memory.py                 # the preset at 1024 x 1024, batch 1
    python bench/qwenimage_memory.py --resolution 1328 --swaps 0 16 30

Not a test and not timed in CI. Nothing is downloaded and no weight memory is allocated: the
transformer, Qwen2.5-VL and the VAE are built from library/models/families/qwenimage/shapes.py on
``torch.device("meta")``, the preset configs/qwenimage_lora.toml is read with the options each
row names, and the figures are those of ``estimate_peak_memory``, what ``--dry_run`` prints and
checks against the device. Captions are shaped by the tiny test tokenizer (an empty caption, as
the estimate draws it, is the prompt template's tokens in either tokenizer).

Rows: bf16 base; ``fp8_base`` (the frozen Linear weights of the transformer and Qwen2.5-VL in
float8); then ``blocks_to_swap`` of the transformer's 60 blocks kept in host memory; then the
transformer quantized (``base_model_precision``) with Qwen2.5-VL in float8.
"""

from __future__ import annotations

import argparse
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
from library.models.families.qwenimage import shapes  # noqa: E402
from library.models.families.qwenimage.family import qwenimage_family  # noqa: E402
from library.models.families.qwenimage.objective import (  # noqa: E402
    QwenImageFlowObjective,
    qwenimage_flow_options,
)
from library.models.families.qwenimage.tiny_tokenizer import (  # noqa: E402
    write_tiny_qwen25vl_tokenizer,
)
from library.models.loader import Components  # noqa: E402
from library.training.memory_estimate import estimate_peak_memory  # noqa: E402
from library.training.setup import WEIGHT_DTYPES, setup_training  # noqa: E402

GIB = 1024**3
PRESET = REPO / "configs" / "qwenimage_lora.toml"


def meta_components(config, tokenizer) -> Components:
    """The full-size model on the meta device, frozen, in the config's weight dtype."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    dtype = WEIGHT_DTYPES[config.training.mixed_precision]
    with torch.device("meta"):
        transformer = QwenImageTransformer2DModel(**shapes.transformer_config())
        vae = AutoencoderKLQwenImage(**shapes.vae_config())
        text = Qwen2_5_VLForConditionalGeneration(
            Qwen2_5_VLConfig(**shapes.text_encoder_config())
        )
    for module in (transformer, text):
        module.to(dtype).requires_grad_(False).eval()
    vae.requires_grad_(False).eval()
    return Components(
        denoiser=transformer,
        vae=vae,
        text_encoders=(text,),
        tokenizers=(tokenizer,),
        objective=QwenImageFlowObjective(
            qwenimage_flow_options(config.flow), shapes.scheduler_config()
        ),
        family=qwenimage_family(),
        model_dir=REPO,
    )


def preset_with(folder: Path, resolution: int, **training) -> object:
    """The preset read with ``training`` keys over its [training] table."""
    data = tomllib.loads(PRESET.read_text(encoding="utf-8"))
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
    return repr(value)


def estimate(config, tokenizer, resolution: int):
    parts = setup_training(config, meta_components(config, tokenizer))
    dataset = SimpleNamespace(buckets=[], resolution=(resolution, resolution), batch_size=1)
    return estimate_peak_memory(
        config, parts, SimpleNamespace(datasets=[dataset]), 1, False, "cuda"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--swaps", type=int, nargs="+", default=[16, 24, 30, 45])
    args = parser.parse_args()
    rows = [("bf16 base", {}), ("fp8_base", {"fp8_base": True})]
    rows += [(f"fp8_base, blocks_to_swap {n}", {"fp8_base": True, "blocks_to_swap": n})
             for n in args.swaps]  # fmt: skip
    # a quantized transformer, Qwen2.5-VL in float8 (fp8_base)
    quantized = {"fp8_base": True, "bnb_4bit_use_double_quant": True}
    rows += [
        ("int8-bnb transformer, fp8 text encoder",
         {"fp8_base": True, "base_model_precision": "int8-bnb"}),
        ("nf4-bnb (double quant) transformer, fp8 text encoder",
         {**quantized, "base_model_precision": "nf4-bnb"}),
        ("nf4-bnb (double quant), fp8 text encoder, blocks_to_swap 16",
         {**quantized, "base_model_precision": "nf4-bnb", "blocks_to_swap": 16}),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = _tokenizer(folder / "tokenizer")
        print(f"Qwen-Image LoRA (the preset: rank 16, bf16, gradient checkpointing, AdamW8bit), "
              f"{args.resolution} x {args.resolution}, batch 1; GiB")  # fmt: skip
        print("| options | weights | adapters + optimizer | activations | peak |")
        print("|---|---|---|---|---|")
        for label, training in rows:
            found = estimate(preset_with(folder, args.resolution, **training), tokenizer,
                             args.resolution)  # fmt: skip
            cells = (found.weights, found.trained_state, found.activations, found.total)
            print(f"| {label} | " + " | ".join(f"{c / GIB:.1f}" for c in cells) + " |")


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    write_tiny_qwen25vl_tokenizer(folder)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


if __name__ == "__main__":
    main()
