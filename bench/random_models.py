"""Models for the benchmarks, written once as diffusers folders: the tiny random models the tests
use, and random-weight models at the released shapes (nothing downloaded).

    from bench.random_models import model_folder
    folder = model_folder("sdxl", Path("~/.cache/difftune-bench").expanduser())

Names (``MODELS``):

- ``tiny-sd1``, ``tiny-sdxl``, ``tiny-flux``, ``tiny-sd3``: the tests' tiny models (seconds);
- ``sd15``, ``sdxl``: SD 1.5 and SDXL base at full size, from the configs the single-file loader
  ships (library/models/configs), about 2 GB and 7 GB in float16;
- ``flux-dev``: FLUX.1 [dev] at full size (library/models/families/flux/shapes.py), about 33 GB
  in bfloat16 with T5-XXL;
- ``flux-dev-6``: FLUX.1 [dev]'s widths, its AE and CLIP-L, with 2 double and 4 single blocks
  and a 2-layer T5-XXL, for machines whose memory cannot hold the full model (CPUs): every
  layer has the released shape, there are fewer of them.

Text encoders keep their released vocabulary sizes, so any id of the tiny test tokenizers (which
every folder carries) fits. Weights are drawn under seed 0 on ``device`` (a GPU draws them in a
fraction of the CPU's time) and stored in the half-precision dtype the released files use;
a weight's value does not change a step's cost or memory. A folder is written beside its final
name and renamed when complete, so an interrupted write is never taken for a model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

MODELS = ("tiny-sd1", "tiny-sdxl", "tiny-flux", "tiny-sd3", "sd15", "sdxl", "flux-dev",
          "flux-dev-6")  # fmt: skip


class UnknownModel(ValueError):
    """A model name outside ``MODELS``."""


def model_folder(name: str, cache: Path, device: str = "cpu", log: Callable = print) -> Path:
    """The diffusers folder of ``name``, written into ``cache`` the first time."""
    if name not in MODELS:
        raise UnknownModel(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    folder = cache / name
    if (folder / "model_index.json").exists():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"writing the {name} model to {folder} (once)")
    _WRITERS[name](tmp, device)
    tmp.replace(folder)
    return folder


def _tiny(family: str) -> Callable[[Path, str], None]:
    def write(folder: Path, device: str) -> None:
        if family in ("sd1", "sdxl"):
            from tests.kits.sd.tiny import save_tiny_model

            save_tiny_model(folder, family, seed=0)
        elif family == "flux":
            from tests.kits.flux.tiny_files import write_tiny_flux_folder

            write_tiny_flux_folder(folder, "dev", seed=0)
        else:
            from tests.kits.sd3.tiny_files import write_tiny_sd3_folder

            write_tiny_sd3_folder(folder, seed=0)

    return write


def _drawn(build: Callable[[], torch.nn.Module], device: str, dtype: torch.dtype):
    """``build()`` made in ``dtype`` with its weights drawn on ``device`` (on the CPU when the
    GPU cannot hold it: FLUX.1's transformer is 24 GB in bfloat16), returned on the CPU."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        try:
            with torch.device(device):
                module = build()
        except torch.OutOfMemoryError:
            with torch.device("cpu"):
                module = build()
    finally:
        torch.set_default_dtype(default)
    return module.to("cpu", dtype)


def _write_sd(folder: Path, device: str, version: str) -> None:
    """SD 1.5 or SDXL base at full size (random weights, seed 0) as a diffusers folder, with
    the tiny CLIP tokenizer for every text encoder."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from library.models.checkpoint_parts import build_unet, build_vae, read_config
    from library.models.families.sd.checkpoint_layout import CONFIGS_DIR
    from tests.kits.sd.tiny import save_sd_pipeline, write_tiny_tokenizer

    configs = CONFIGS_DIR / ("sd15" if version == "sd15" else "sdxl-base")
    half = torch.float16
    torch.manual_seed(0)
    parts = {
        "unet": _drawn(lambda: build_unet(read_config(configs, "unet")), device, half),
        "vae": _drawn(lambda: build_vae(read_config(configs, "vae")), device, half),
        "text_encoder": _drawn(
            lambda: CLIPTextModel(CLIPTextConfig(**read_config(configs, "text_encoder"))),
            device,
            half,
        ),
    }
    if version == "sd15":
        parts["scheduler"] = DDIMScheduler.from_config(read_config(configs, "scheduler"))
        save_sd_pipeline(folder, parts, write_tiny_tokenizer(folder / "tokenizer"))
        return
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    second = CLIPTextConfig(**read_config(configs, "text_encoder_2"))
    parts["text_encoder_2"] = _drawn(lambda: CLIPTextModelWithProjection(second), device, half)
    parts["scheduler"] = EulerDiscreteScheduler.from_config(read_config(configs, "scheduler"))
    tokenizers = {
        name: CLIPTokenizer.from_pretrained(str(write_tiny_tokenizer(folder / name)))
        for name in ("tokenizer", "tokenizer_2")
    }
    StableDiffusionXLPipeline(**parts, **tokenizers, add_watermarker=False).save_pretrained(
        folder, safe_serialization=True
    )


def _write_flux(folder: Path, device: str, depth: tuple[int, int, int] | None) -> None:
    """FLUX.1 [dev] at full size, or with ``depth`` = (double blocks, single blocks, T5
    layers) at the released widths, as a diffusers FluxPipeline folder."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from library.models.families.flux import shapes
    from library.models.families.flux.sampling import flux_scheduler_config
    from tests.kits.flux.tiny import write_tiny_t5_tokenizer
    from tests.kits.flux.tiny_files import pipeline_index
    from tests.kits.sd.tiny import write_tiny_tokenizer

    transformer, t5 = shapes.transformer_config("dev"), shapes.t5_xxl_config()
    if depth is not None:
        transformer["num_layers"], transformer["num_single_layers"], t5["num_layers"] = depth
    bf16 = torch.bfloat16
    torch.manual_seed(0)
    parts = {
        "transformer": _drawn(lambda: FluxTransformer2DModel(**transformer), device, bf16),
        "vae": _drawn(lambda: AutoencoderKL(**shapes.ae_config()), device, bf16),
        "text_encoder": _drawn(
            lambda: CLIPTextModel(CLIPTextConfig(**shapes.clip_l_config())), device, bf16
        ),
        "text_encoder_2": _drawn(lambda: T5EncoderModel(T5Config(**t5)), device, bf16),
    }
    folder.mkdir(parents=True)
    for name, module in parts.items():
        module.save_pretrained(folder / name, safe_serialization=True)
        del module
    write_tiny_tokenizer(folder / "tokenizer")
    write_tiny_t5_tokenizer(folder / "tokenizer_2")
    FlowMatchEulerDiscreteScheduler(**flux_scheduler_config("dev")).save_pretrained(
        folder / "scheduler"
    )
    text = json.dumps(pipeline_index(), indent=2, sort_keys=True) + "\n"
    (folder / "model_index.json").write_text(text, encoding="utf-8")


_WRITERS: dict[str, Callable[[Path, str], None]] = {
    "tiny-sd1": _tiny("sd1"),
    "tiny-sdxl": _tiny("sdxl"),
    "tiny-flux": _tiny("flux"),
    "tiny-sd3": _tiny("sd3"),
    "sd15": lambda folder, device: _write_sd(folder, device, "sd15"),
    "sdxl": lambda folder, device: _write_sd(folder, device, "sdxl"),
    "flux-dev": lambda folder, device: _write_flux(folder, device, None),
    "flux-dev-6": lambda folder, device: _write_flux(folder, device, (2, 4, 2)),
}
