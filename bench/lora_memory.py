"""The dry run's memory estimate of LoRA training at full size, on the meta device.

    python bench/lora_memory.py                          # every family below
    python bench/lora_memory.py --families flux --resolution 768 --swaps 0 18

Not a test and not timed in CI. Nothing is downloaded and no weight memory is allocated: each
family's denoiser, text encoders and VAE are built at full size on ``torch.device("meta")``, its
preset in configs/ is read with the options each row names, and the figures are those of
``estimate_peak_memory``, what ``--dry_run`` prints and checks against the device; the peak
column is the tensors' (the dry run adds the process's own memory, on a GPU the CUDA context:
library/training/process_memory.py). One table per
family, at the preset's resolution (``--resolution`` overrides it) and batch 1 (SD 1.5's preset
trains at batch 2):

- SD 1.5 (configs/sd15_lora.toml, 512; the text encoder trains too) and SDXL
  (configs/sdxl_lora.toml, 1024), from the released configs in library/models/configs;
- FLUX.1 [dev] (configs/flux_lora.toml), SD3.5 Large (configs/sd35_large_lora.toml), Z-Image
  Turbo (configs/zimage_lora.toml), Chroma (configs/chroma_lora.toml), Qwen-Image
  (configs/qwenimage_lora.toml) and Krea 2 (configs/krea2_lora.toml), all at 1024, and Wan 2.1
  T2V 1.3B and 14B (configs/wan21_t2v_lora.toml, an image at the preset's side), Wan 2.1
  I2V-14B (configs/wan21_i2v_14b_lora.toml, with its CLIP ViT-H image encoder), Wan 2.2
  TI2V-5B (configs/wan22_ti2v_5b_lora.toml, with its Wan 2.2 VAE) and Wan 2.2 T2V-A14B's and
  I2V-A14B's two experts (configs/wan22_t2v_a14b_lora.toml, configs/wan22_i2v_a14b_lora.toml:
  both trained, the inactive one on
  the device or in host memory with ``offload_inactive_dit``, or one expert a run), from each
  family's released configs.

The edit models (FLUX.1 Kontext, Qwen-Image-Edit) are left out: their peak depends on the
reference images' sizes, which this bench does not draw. Captions are shaped by the tiny
tokenizers (tests/assets, or the family's tiny tokenizer writer): an empty caption, as the
estimate draws it, is the prompt template's tokens, or CLIP's and T5's padded lengths, with
either tokenizer.

Rows: bf16 base; ``fp8_base`` (the frozen Linear weights of the denoiser and the text encoders
in float8); ``blocks_to_swap`` of the transformer's blocks kept in host memory; the denoiser
quantized (``base_model_precision``) with the text encoders in float8. A UNet has no blocks to
swap (the setup refuses ``blocks_to_swap`` for SD 1.5 and SDXL), so their tables have no swap
rows, and its float8 and quantized storage covers its Linear layers only (its convolutions stay
in bf16).

Columns: the estimate's parts; "text encoders caching": the text encoders alone on the device while
they fill the text cache, where they leave it afterwards (0: they stay beside the denoiser and
count among the weights). The peak is the larger of that moment and the weights plus the larger of
the step (adapters + optimizer + activations) and the VAE's encoding (what encoding the images
holds above the weights: while the latent cache is built, with the VAE back on the device).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from library.third_party_noise import silence_unactionable_messages  # noqa: E402

silence_unactionable_messages()  # before any import below loads bitsandbytes

import torch  # noqa: E402

from library.config.loader import load_config  # noqa: E402
from library.models.components import Components  # noqa: E402
from library.training.memory_estimate import estimate_peak_memory  # noqa: E402
from library.training.setup import WEIGHT_DTYPES, setup_training  # noqa: E402

GIB = 1024**3
ASSETS = REPO / "tests" / "assets"  # the tiny test tokenizers (tools/make_test_assets.py)


def sd_components(config, family) -> Components:
    """An SD 1.x or SDXL ``family`` at full size on the meta device, frozen, in the config's
    weight dtype: the released configs a single-file checkpoint loads with (its layout's folder
    in library/models/configs), built by that loader's own builders."""
    from library.models.checkpoint_parts import build_unet, build_vae, read_config, text_builder
    from library.models.families.sd.objective import ddpm_objective

    layout = family.checkpoint_layout()
    configs = layout.config_dir(family.v_parameterization)
    with torch.device("meta"):
        unet = build_unet(read_config(configs, "unet"))
        vae = build_vae(read_config(configs, "vae"))
        texts = tuple(
            text_builder(tower)(read_config(configs, tower.subfolder)) for tower in layout.towers
        )
    # CLIP-L and OpenCLIP share CLIP's vocabulary and 77-token padding: one tiny tokenizer each
    tokenizers = tuple(_tokenizer(ASSETS / "tokenizer") for _ in layout.towers)
    schedule = read_config(configs, "scheduler")
    objective = ddpm_objective(schedule, family, config.model.zero_terminal_snr)
    return _frozen(config, unet, vae, texts, tokenizers, objective, family)


def sd15_components(config, folder: Path) -> Components:
    """SD 1.5 at full size on the meta device (see ``sd_components``)."""
    from library.models.families.sd.family import SD1

    return sd_components(config, SD1)


def sdxl_components(config, folder: Path) -> Components:
    """SDXL base 1.0 at full size on the meta device (see ``sd_components``)."""
    from library.models.families.sd.family import SDXL

    return sd_components(config, SDXL)


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
    from tests.kits.qwenimage.tiny_tokenizer import write_tiny_qwen25vl_tokenizer

    with torch.device("meta"):
        transformer = QwenImageTransformer2DModel(**shapes.transformer_config())
        vae = AutoencoderKLQwenImage(**shapes.vae_config())
        text = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**shapes.text_encoder_config()))
    tokenizer = _tokenizer(write_tiny_qwen25vl_tokenizer(folder / "qwen"))
    objective = QwenImageFlowObjective(
        qwenimage_flow_options(config.flow), shapes.scheduler_config()
    )
    return _frozen(config, transformer, vae, (text,), (tokenizer,), objective, qwenimage_family())


def krea2_components(config, folder: Path) -> Components:
    """Krea 2 RAW at full size on the meta device, frozen, in the config's weight dtype."""
    from diffusers import AutoencoderKLQwenImage, Krea2Transformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLModel

    from library.models.families.krea2 import spec
    from library.models.families.krea2.family import krea2_family
    from library.models.families.qwen_vl_file import QWEN3VL_4B
    from tests.kits.krea2.tiny_tokenizer import write_tiny_qwen3vl_tokenizer

    with torch.device("meta"):
        transformer = Krea2Transformer2DModel()  # diffusers' defaults are the release's
        vae = AutoencoderKLQwenImage()
        text = Qwen3VLModel(Qwen3VLConfig(**QWEN3VL_4B))
    tokenizer = _tokenizer(write_tiny_qwen3vl_tokenizer(folder / "qwen3vl"))
    objective = spec.Krea2FlowObjective(
        spec.flow_options(config.flow), spec.scheduler_config(), patch=spec.PATCH
    )
    return _frozen(config, transformer, vae, (text,), (tokenizer,), objective, krea2_family())


def wan_components(task: str) -> Callable[[object, Path], Components]:
    """Wan's released transformer of ``task`` with umT5-XXL and the Wan 2.1 VAE at full size
    on the meta device, frozen, in the config's weight dtype."""

    def build(config, folder: Path) -> Components:
        from diffusers import AutoencoderKLWan, WanTransformer3DModel
        from transformers import UMT5Config, UMT5EncoderModel

        from library.models.experts import HIGH_NOISE, LOW_NOISE, Experts
        from library.models.families.wan import spec
        from library.models.families.wan.experts import I2V_A14B_BOUNDARY, T2V_A14B_BOUNDARY
        from library.models.families.wan.family import (
            WAN,
            WAN_I2V,
            WAN_I2V_CLIP,
            WAN_TI2V,
            WanFlowObjective,
            spec_flow_options,
        )
        from library.models.text_encoders.umt5 import umt5_xxl_config
        from tests.kits.wan.tiny_tokenizer import write_tiny_umt5_tokenizer

        ti2v = task == "ti2v-5B"  # its own VAE (Wan 2.2's) and per-token timesteps
        with torch.device("meta"):
            transformer = WanTransformer3DModel(**spec.released_transformer_config(task))
            vae = AutoencoderKLWan(**(spec.ti2v_vae_config() if ti2v else {}))
            text = UMT5EncoderModel(UMT5Config(**umt5_xxl_config()))
        tokenizer = _tokenizer(write_tiny_umt5_tokenizer(folder / "umt5"))
        shift = spec.TI2V_SAMPLE_SHIFT if ti2v else spec.DISCRETE_FLOW_SHIFT
        objective = WanFlowObjective(
            spec_flow_options(config.flow), spec.scheduler_config(shift), patch=2
        )
        families = {"ti2v-5B": WAN_TI2V, "i2v-A14B": WAN_I2V, "i2v-14B": WAN_I2V_CLIP}
        family = families.get(task, WAN)
        components = _frozen(config, transformer, vae, (text,), (tokenizer,), objective, family)
        if task == "i2v-14B":  # its CLIP ViT-H/14 vision tower beside
            return replace(components, image_encoder=_clip_vision_h(transformer.dtype))
        if not task.endswith("-A14B"):
            return components
        # the low-noise expert beside it, split at the released folder's boundary
        with torch.device("meta"):
            low = WanTransformer3DModel(**spec.released_transformer_config(task))
        low.to(transformer.dtype).requires_grad_(False).eval()
        boundary = I2V_A14B_BOUNDARY if family is WAN_I2V else T2V_A14B_BOUNDARY
        experts = Experts({HIGH_NOISE: transformer, LOW_NOISE: low}, boundary)
        return replace(components, denoiser=low, experts=experts)

    return build


def _clip_vision_h(dtype: torch.dtype):
    """CLIP ViT-H/14's vision tower (Wan 2.1 I2V's image encoder) on the meta device, frozen,
    with the released preprocessing."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    from library.models.image_encoders.clip_vision import ImageEncoder, clip_processor
    from library.models.image_encoders.clip_vision_file import VIT_H

    with torch.device("meta"):
        model = CLIPVisionModel(CLIPVisionConfig(**VIT_H))
    model.to(dtype).requires_grad_(False).eval()
    return ImageEncoder(model, clip_processor())


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


def sd35_large_components(config, folder: Path) -> Components:
    """SD3.5 Large at full size on the meta device, frozen, in the config's weight dtype."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        T5Config,
        T5EncoderModel,
    )

    from library.models.families.sd3 import shapes
    from library.models.families.sd3.family import pad_with_id_zero, sd3_family
    from library.models.families.sd3.objective import SD3FlowObjective
    from library.models.families.sd3.sampling import sd3_scheduler_config
    from library.training.objectives import FlowOptions

    with torch.device("meta"):
        transformer = SD3Transformer2DModel(**shapes.transformer_config("sd3.5-large"))
        vae = AutoencoderKL(**shapes.vae_config())
        clip_l = CLIPTextModelWithProjection(CLIPTextConfig(**shapes.clip_l_config()))
        clip_g = CLIPTextModelWithProjection(CLIPTextConfig(**shapes.clip_g_config()))
        t5 = T5EncoderModel(T5Config(**shapes.t5_xxl_config()))
    texts = (clip_l, clip_g, t5)
    # CLIP-L and CLIP-G share CLIP's vocabulary; CLIP-G pads with id 0, as load_sd3 sets it
    tokenizers = (
        _tokenizer(ASSETS / "tokenizer"),
        pad_with_id_zero(_tokenizer(ASSETS / "tokenizer")),
        _tokenizer(ASSETS / "t5_tokenizer"),
    )
    objective = SD3FlowObjective(FlowOptions.from_section(config.flow), sd3_scheduler_config())
    family = sd3_family("sd3.5-large", config.flow, texts)
    return _frozen(config, transformer, vae, texts, tokenizers, objective, family)


def zimage_components(config, folder: Path) -> Components:
    """Z-Image Turbo (the preset's model; Base has the same shapes) at full size on the meta
    device, frozen, in the config's weight dtype."""
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from library.models.families.zimage import shapes
    from library.models.families.zimage.family import zimage_family
    from library.models.families.zimage.objective import (
        ZImageFlowObjective,
        zimage_flow_options,
    )

    with torch.device("meta"):
        transformer = ZImageTransformer2DModel(**shapes.transformer_config())
        vae = AutoencoderKL(**shapes.ae_config())
        text = Qwen3Model(Qwen3Config(**shapes.text_encoder_config()))
    tokenizer = _tokenizer(ASSETS / "qwen3_tokenizer")
    objective = ZImageFlowObjective(
        zimage_flow_options(config.flow), shapes.scheduler_config("turbo")
    )
    family = zimage_family("turbo", shapes.SCHEDULER_SHIFT["turbo"])
    return _frozen(config, transformer, vae, (text,), (tokenizer,), objective, family)


def chroma_components(config, folder: Path) -> Components:
    """Chroma1-HD at full size on the meta device, frozen, in the config's weight dtype."""
    from diffusers import AutoencoderKL, ChromaTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    from library.models.families.chroma import shapes
    from library.models.families.chroma.family import chroma_family
    from library.models.families.flux import shapes as flux_shapes
    from library.training.objectives import FlowMatchingObjective, FlowOptions

    with torch.device("meta"):
        transformer = ChromaTransformer2DModel(**shapes.transformer_config())
        vae = AutoencoderKL(**flux_shapes.ae_config())  # FLUX.1's AE and T5-XXL
        t5 = T5EncoderModel(T5Config(**flux_shapes.t5_xxl_config()))
    tokenizer = _tokenizer(ASSETS / "t5_tokenizer")
    # a folder without scheduler/ samples with this config (load_chroma's fallback)
    objective = FlowMatchingObjective(
        FlowOptions.from_section(config.flow), dict(shapes.SCHEDULER_CONFIG)
    )
    family = chroma_family(config.flow)
    return _frozen(config, transformer, vae, (t5,), (tokenizer,), objective, family)


def flux2_text_config(model: str) -> dict:
    """The released text encoder's config of FLUX.2 ``model``: Qwen3-4B (klein 4B), Qwen3-8B
    (klein 9B: Qwen3-4B's layout, wider, its LM head untied) or Mistral Small 3.1 24B (dev:
    Mistral3ForConditionalGeneration, its language model and the Pixtral vision tower, which
    FLUX.2 leaves unused). The family reads these from the files; the bench has none."""
    from library.models.released_configs import qwen3_4b_config

    if model == "klein-4b":
        return qwen3_4b_config()
    if model == "klein-9b":
        return {**qwen3_4b_config(), "hidden_size": 4096, "intermediate_size": 12288,
                "tie_word_embeddings": False}  # fmt: skip
    text = dict(model_type="mistral", hidden_size=5120, intermediate_size=32768,
                num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                vocab_size=131072, rope_theta=1e9, max_position_embeddings=131072)  # fmt: skip
    vision = dict(model_type="pixtral", hidden_size=1024, intermediate_size=4096,
                  num_hidden_layers=24, num_attention_heads=16, head_dim=64, image_size=1540,
                  patch_size=14)  # fmt: skip
    return dict(text_config=text, vision_config=vision, spatial_merge_size=2)


def flux2_components(model: str):
    """FLUX.2 ``model`` ("klein-4b", "klein-9b": base; "dev") at full size on the meta device,
    frozen, in the config's weight dtype."""

    def build(config, folder: Path) -> Components:
        from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
        from transformers import (
            Mistral3Config,
            Mistral3ForConditionalGeneration,
            Qwen3Config,
            Qwen3ForCausalLM,
        )

        from library.models.families.flux2 import spec
        from library.models.families.flux2.family import flux2_family
        from library.models.families.flux2.spec import Flux2FlowObjective, flux2_flow_options

        with torch.device("meta"):
            transformer = Flux2Transformer2DModel(**spec.COMMON, **spec.RELEASED[model])
            vae = AutoencoderKLFlux2()  # the released VAE's config is the class default
            if model == "dev":
                text = Mistral3ForConditionalGeneration(Mistral3Config(**flux2_text_config(model)))
            else:
                text = Qwen3ForCausalLM(Qwen3Config(**flux2_text_config(model)))
        tokenizer = _tokenizer(ASSETS / "qwen3_tokenizer")
        if model == "dev":  # the tiny tokenizer with a chat template of Mistral's shape
            from tests.kits.flux2.tiny import MISTRAL_TEMPLATE

            tokenizer.chat_template = MISTRAL_TEMPLATE
        objective = Flux2FlowObjective(
            flux2_flow_options(config.flow), spec.SCHEDULER_CONFIG, patch=1
        )
        name, _, size = model.partition("-")
        family = flux2_family(name, size or "32b", False)
        return _frozen(config, transformer, vae, (text,), (tokenizer,), objective, family)

    return build


def _frozen(config, denoiser, vae, texts, tokenizers, objective, family) -> Components:
    dtype = WEIGHT_DTYPES[config.training.mixed_precision]
    for module in (denoiser, *texts):
        module.to(dtype).requires_grad_(False).eval()
    vae.requires_grad_(False).eval()
    return Components(
        denoiser=denoiser,
        vae=vae,
        text_encoders=texts,
        tokenizers=tokenizers,
        objective=objective,
        family=family,
        model_dir=REPO,
    )


@dataclass(frozen=True)
class Bench:
    """One family's table: its label, preset, components on the meta device, and default
    blocks_to_swap rows (none for a UNet, whose blocks the setup refuses to swap)."""

    label: str
    preset: Path
    build: Callable[[object, Path], Components]
    swaps: tuple[int, ...] = ()
    rows: Callable[[list[int]], list[tuple[str, dict]]] | None = None  # None: rows()

    def resolution(self) -> int | list[int]:
        """The preset's (first dataset's) resolution: 512 for SD 1.5, [832, 480] for Wan, 1024
        for the others."""
        data = tomllib.loads(self.preset.read_text(encoding="utf-8"))
        return data["datasets"][0]["resolution"]


def _preset(name: str) -> Path:
    return REPO / "configs" / name


# In the registry's order. Default blocks_to_swap rows: the count each preset's comments suggest
# (FLUX.1 18, SD3.5 Large 18, Z-Image 10, Chroma 10, Qwen-Image 30) among larger ones up to about
# three quarters of the blocks; the nf4 row swaps the first.
FAMILIES = {
    "sd15": Bench("SD 1.5", _preset("sd15_lora.toml"), sd15_components),
    "sdxl": Bench("SDXL", _preset("sdxl_lora.toml"), sdxl_components),
    "flux": Bench("FLUX.1 [dev]", _preset("flux_lora.toml"), flux_components, (18, 30)),
    "sd35-large": Bench("SD3.5 Large", _preset("sd35_large_lora.toml"), sd35_large_components,
                        (18, 30)),
    "flux2-klein-4b": Bench("FLUX.2 [klein] base 4B", _preset("flux2_klein_lora.toml"),
                            flux2_components("klein-4b"), (8, 16)),
    "flux2-klein-9b": Bench("FLUX.2 [klein] base 9B", _preset("flux2_klein_lora.toml"),
                            flux2_components("klein-9b"), (8, 16)),
    "flux2-dev": Bench("FLUX.2 [dev]", _preset("flux2_dev_lora.toml"), flux2_components("dev"),
                       (24, 40)),
    "zimage": Bench("Z-Image Turbo", _preset("zimage_lora.toml"), zimage_components, (10, 20)),
    "chroma": Bench("Chroma", _preset("chroma_lora.toml"), chroma_components, (10, 18, 30)),
    "qwenimage": Bench("Qwen-Image", _preset("qwenimage_lora.toml"), qwenimage_components,
                       (16, 24, 30, 45)),
    "krea2": Bench("Krea 2", _preset("krea2_lora.toml"), krea2_components, (10, 14, 20)),
    "wan-1.3b": Bench("Wan 2.1 T2V 1.3B", _preset("wan21_t2v_lora.toml"),
                      wan_components("t2v-1.3B"), (10, 20)),
    "wan-14b": Bench("Wan 2.1 T2V 14B / Wan 2.2 A14B expert", _preset("wan21_t2v_lora.toml"),
                     wan_components("t2v-14B"), (10, 20, 30)),
    "wan-i2v-14b": Bench("Wan 2.1 I2V-14B", _preset("wan21_i2v_14b_lora.toml"),
                         wan_components("i2v-14B"), (10, 20)),
    "wan-ti2v-5b": Bench("Wan 2.2 TI2V-5B", _preset("wan22_ti2v_5b_lora.toml"),
                         wan_components("ti2v-5B"), (10, 20)),
    "wan-a14b": Bench("Wan 2.2 T2V-A14B, two experts", _preset("wan22_t2v_a14b_lora.toml"),
                      wan_components("t2v-A14B"), (10, 20), lambda swaps: expert_rows(swaps)),
    "wan-i2v-a14b": Bench("Wan 2.2 I2V-A14B, two experts", _preset("wan22_i2v_a14b_lora.toml"),
                          wan_components("i2v-A14B"), (10, 20), lambda swaps: expert_rows(swaps)),
}  # fmt: skip
# [experts] keys a row may set (the others are [training]'s)
EXPERT_KEYS = ("offload_inactive_dit", "train_experts")


def preset_with(preset: Path, folder: Path, resolution: int, **training) -> object:
    """The preset read with ``training`` keys over its [training] table."""
    data = tomllib.loads(preset.read_text(encoding="utf-8"))
    if "experts" in data:  # its rows say each memory option they use
        data["experts"] = {k: training.pop(k) for k in EXPERT_KEYS if k in training}
    if "experts" in data or data["training"].get("fp8_base"):  # a preset's fp8_base: the rows'
        training = {"fp8_base": False, **training}
    data["training"].update(training)
    data["datasets"][0]["resolution"] = resolution
    subset = data["datasets"][0]["subsets"][0]
    for key in ("video_directory", "target_frames", "frame_extraction"):
        subset.pop(key, None)  # the bench draws an image (a one-frame clip)
    subset["image_dir"] = str(folder)
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
    sides = tuple(resolution) if isinstance(resolution, list) else (resolution, resolution)
    dataset = SimpleNamespace(buckets=[], resolution=sides, batch_size=1)
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


def expert_rows(swaps: list[int]) -> list[tuple[str, dict]]:
    """Two experts: both on the device, the inactive one in host memory, one expert a run."""
    fp8 = {"fp8_base": True}
    offload = {**fp8, "offload_inactive_dit": True}
    return [
        ("both experts, bf16 base", {}),
        ("both, `fp8_base`", fp8),
        ("both, `fp8_base`, `offload_inactive_dit`", offload),
        *((f"one expert (`train_experts`), `fp8_base`, `blocks_to_swap = {n}`",
           {**fp8, "train_experts": "high_noise", "blocks_to_swap": n}) for n in swaps),
        ('both, `offload_inactive_dit`, `base_model_precision = "nf4-bnb"` (double quant), '
         "`fp8_base`", {**offload, "base_model_precision": "nf4-bnb",
                        "bnb_4bit_use_double_quant": True}),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES),
                        default=list(FAMILIES))  # fmt: skip
    parser.add_argument("--resolution", type=int, default=None,
                        help="image side in pixels (default: each preset's)")  # fmt: skip
    parser.add_argument("--swaps", type=int, nargs="+", default=None,
                        help="blocks_to_swap rows of the transformer families "
                        "(default: per family)")  # fmt: skip
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the setup's notes about each row's options
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in args.families:
            bench = FAMILIES[name]
            side = args.resolution or bench.resolution()
            # a UNet family gets no swap rows even with --swaps: the setup would refuse them
            swaps = (args.swaps or bench.swaps) if bench.swaps else ()
            size = " x ".join(map(str, side)) if isinstance(side, list) else f"{side} x {side}"
            print(f"\n{bench.label} LoRA ({bench.preset.relative_to(REPO)}), {size}, "
                  "batch 1; GiB")  # fmt: skip
            print("| options | weights | adapters + optimizer | activations | VAE encoding "
                  "| text encoders caching | peak |")  # fmt: skip
            print("|---|---|---|---|---|---|---|")
            for text, training in (bench.rows or rows)(list(swaps)):
                config = preset_with(bench.preset, folder, side, **training)
                found = estimate(config, bench.build, folder, side)
                cells = (found.weights, found.trained_state, found.activations, found.encoding,
                         found.text_caching, found.tensors)  # fmt: skip
                print(f"| {text} | " + " | ".join(f"{c / GIB:.1f}" for c in cells) + " |")


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


if __name__ == "__main__":
    main()
