"""Krea 2's facts as data (diffusers 0.42.1's Krea2Pipeline, Krea2Transformer2DModel and its
single-file converter; musubi-tuner's docs/krea2.md), its models for the shared loader
(library/models/families/spec_loader.py). A Krea2Pipeline folder holds transformer/, the
Qwen-Image VAE, Qwen3VLModel, tokenizer/ and scheduler/ (model_index.json's
text_encoder_select_layers and is_distilled). As single files: the transformer
(pretrained_model_name_or_path, musubi-tuner's --dit: Krea's raw.safetensors / turbo.safetensors
in the original names, keys.py, bare or under ComfyUI's ``model.diffusion_model.``, or
diffusers' names), Qwen3-VL ([flow] text_encoder: Comfy-Org's qwen3vl_4b_bf16.safetensors), the
VAE ([model] vae: qwen_image_vae.safetensors), the tokenizer from tokenizer_path; a file does
not say whether it is RAW or Turbo: [flow] dit_variant does (unset: raw). Also the text
template (Qwen-Image's, padded before its 5 closing tokens, the first 34 dropped) and taps, and
the schedule (exponential shift, mu from 0.5 at 256 tokens to 1.15 at 6400; Turbo: 1.15)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from library.errors import ModelError
from library.models import shape_configs
from library.models.families import qwen_vl_file, wan_vae_file
from library.models.families.folder_loader import CheckedFolder
from library.models.families.krea2.keys import TABLE
from library.models.families.local_tokenizer import tokenizer_part
from library.models.families.name_table import count_numbered
from library.models.families.spec import FamilySpec, MainFile, SpecPart
from library.models.families.spec_loader import claimer
from library.models.families.transformer_family import TrainerDraw
from library.models.model_files import read_json
from library.models.text_encoders.qwen3_vl import TappedQwen3VL
from library.training import flow_matching as fm
from library.training.objectives import VelocityObjective, shift_draw

TAPS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)  # the pipeline's default select layers
MAX_TOKENS = 512  # the pipeline's max_sequence_length
PATCH = 2
PIXEL_MULTIPLE = 8 * PATCH  # the VAE's 8 times the 2x2 patches
PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"


def taps_for(depth: int, count: int) -> tuple[int, ...]:
    """The taps of single files, which do not name them: ``count`` layers evenly spaced, the
    deepest the one before the last (the release's 2, 5, ..., 35 of Qwen3-VL-4B's 36)."""
    step = max(depth // count, 1)
    return tuple(depth - 1 - (count - 1 - i) * step for i in range(count))


def text_taps(layers=TAPS, max_tokens: int = MAX_TOKENS) -> TappedQwen3VL:
    """How Krea 2 reads Qwen3-VL (the pipeline's template, drop and taps)."""
    return TappedQwen3VL(PREFIX, SUFFIX, 34, 5, tuple(layers), max_tokens)


# Training sigmas: musubi-tuner's Krea 2 guide (shift 2.5, the pipeline's at 1024 x 1024, no
# weighting); any [flow] draw key replaces them. The raw output is the velocity noise - x0.
# Its files record the keys musubi-tuner's Krea 2 trainer writes.
DRAW = TrainerDraw(shift_draw(2.5), ("timestep_sampling", "discrete_flow_shift", "weighting_scheme",
                                     "sigmoid_scale"))  # fmt: skip


def krea2_mu(image_seq_len: float) -> float:
    """mu of Krea 2's schedule (scheduler_config's line: 0.5 at 256 image tokens, 1.15 at
    6400) at ``image_seq_len`` tokens, which musubi-tuner's krea2_shift draws with."""
    config = scheduler_config()
    return fm.flux_mu(image_seq_len, base_seq_len=config["base_image_seq_len"],
                      max_seq_len=config["max_image_seq_len"], base_shift=config["base_shift"],
                      max_shift=config["max_shift"])  # fmt: skip


class Krea2FlowObjective(VelocityObjective):
    """Rectified flow (FlowMatchEulerDiscreteScheduler): x_t = (1 - sigma) x0 + sigma noise,
    the transformer's timestep is sigma, its output the velocity (``scheduler.step`` takes it
    as it is)."""

    LABEL = "Krea 2"
    OWN_SHIFTS = {"krea2_shift": krea2_mu}


def scheduler_config() -> dict:
    """The released scheduler/ (FlowMatchEulerDiscreteScheduler, Krea 2's dynamic shift)."""
    return {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True,
            "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
            "max_image_seq_len": 6400, "time_shift_type": "exponential"}  # fmt: skip


def transformer_config(plain) -> dict:
    """Krea2Transformer2DModel kwargs for diffusers-named shapes (KeyError naming a key the
    sizes are read from); the rotary split is the released one, or its proportions."""
    width, in_channels = plain["img_in.weight"]
    head = plain["transformer_blocks.0.attn.norm_q.weight"][0]
    text = plain["txt_in.linear_1.weight"][1]
    fusion = "text_fusion.layerwise_blocks.0."
    text_head = plain[fusion + "attn.norm_q.weight"][0]
    config = {
        "in_channels": in_channels, "num_layers": count_numbered(plain, "transformer_blocks"),
        "attention_head_dim": head, "num_attention_heads": width // head,
        "num_key_value_heads": plain["transformer_blocks.0.attn.to_k.weight"][0] // head,
        "intermediate_size": plain["transformer_blocks.0.ff.gate.weight"][0],
        "timestep_embed_dim": plain["time_embed.linear_1.weight"][1], "text_hidden_dim": text,
        "num_text_layers": plain["text_fusion.projector.weight"][1],
        "text_num_attention_heads": text // text_head,
        "text_num_key_value_heads": plain[fusion + "attn.to_k.weight"][0] // text_head,
        "text_intermediate_size": plain[fusion + "ff.gate.weight"][0],
        "num_layerwise_text_blocks": count_numbered(plain, "text_fusion.layerwise_blocks"),
        "num_refiner_text_blocks": count_numbered(plain, "text_fusion.refiner_blocks"),
        "axes_dims_rope": (32, 48, 48),
    }  # fmt: skip
    shape_configs.fitted_rotary_axes(config, head, "Krea 2 transformer")
    return config


@dataclass(frozen=True)
class Facts:
    """The pipeline's taps and whether the transformer is Turbo."""

    taps: tuple[int, ...]
    distilled: bool


def inspect_parts(checked) -> Facts:
    """A folder's taps (model_index.json's, as many as the transformer reads) and is_distilled;
    single files name neither: the release's taps spaced over Qwen3-VL's layers, and [flow]
    dit_variant."""
    layers = checked.part_config("transformer").get("num_text_layers", len(TAPS))
    if not isinstance(checked, CheckedFolder):
        depth = checked.part_config("text_encoder")["text_config"]["num_hidden_layers"]
        turbo = checked.flow.dit_variant == "turbo"
        return Facts(taps_for(depth, layers), turbo)
    index = read_json(checked.model_dir / "model_index.json")
    taps = tuple(index.get("text_encoder_select_layers") or TAPS)
    if len(taps) != layers:
        raise ModelError(
            f"{checked.model_dir / 'model_index.json'}: text_encoder_select_layers names "
            f"{len(taps)} layers and the transformer reads {layers}; the folder is inconsistent"
        )
    return Facts(taps, bool(index.get("is_distilled", False)))


TOKENIZER_WHERE = "a Krea 2 folder's tokenizer/ (Qwen3-VL-4B-Instruct's)"
WHATS = {
    "text_encoder": "the Qwen3-VL text encoder (qwen3vl_4b_bf16.safetensors)",
    "vae": "the Qwen-Image VAE (qwen_image_vae.safetensors)",
}


SPEC = FamilySpec(
    family="Krea 2",
    pipeline="Krea2Pipeline",
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:Krea2Transformer2DModel",
            label="Krea 2 transformer",
            main=MainFile(
                names=TABLE,
                original_marks=("txtfusion.projector.",),  # names only Krea 2 has
                diffusers_marks=("text_fusion.projector.",),
                config_from_shapes=transformer_config,
                damaged=re.compile(r'"(model\.diffusion_model\.)?(txtfusion|text_fusion)\.projector\.'),
                example="raw.safetensors (krea/Krea-2-Raw)",
            ),
        ),
        wan_vae_file.video_vae_part(WHATS["vae"], "Qwen-Image VAE"),
        qwen_vl_file.text_encoder_part(qwen_vl_file.QWEN3_VL, WHATS["text_encoder"]),
    ),
    tokenizers=(tokenizer_part("Qwen3-VL", TOKENIZER_WHERE),),
    inspect=inspect_parts,
    other={"scheduler": "scheduler_config.json"},
)  # fmt: skip
claims_krea2 = claimer(SPEC)
