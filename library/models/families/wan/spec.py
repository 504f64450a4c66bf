"""Wan's facts as data (diffusers 0.42.1's WanPipeline, WanTransformer3DModel, AutoencoderKLWan
and its single-file converter; musubi-tuner's Wan guide), its models for the shared loader
(library/models/families/spec_loader.py). A WanPipeline folder (Wan-AI/Wan2.1-T2V-1.3B-Diffusers,
-14B-Diffusers) holds transformer/, vae/ (AutoencoderKLWan), text_encoder/ (UMT5EncoderModel),
tokenizer/ (umT5's) and scheduler/ (UniPCMultistepScheduler with the flow shift). As single
files: the transformer (pretrained_model_name_or_path, musubi-tuner's --dit: Wan-AI's
diffusion_pytorch_model*.safetensors or Comfy-Org's wan2.1_t2v_*.safetensors in the original
names, keys.py, bare or under ``model.diffusion_model.``, or diffusers' names; a Wan 2.2 A14B
expert's file is one of these), umT5 ([flow] t5: umt5_xxl_fp16.safetensors, or Wan-AI's
models_t5_umt5-xxl-enc-bf16.pth in the names of Wan's own T5 code), the VAE ([model]
vae: wan_2.1_vae.safetensors) and umT5's tokenizer (t5_tokenizer_path, or found locally).
Wan 2.1 I2V-14B (SPEC_I2V_CLIP): a WanImageToVideoPipeline folder with image_encoder/
(CLIPVisionModel) and image_processor/, or its transformer file beside [flow] clip (Comfy-Org's
clip_vision_h.safetensors, Wan-AI's CLIP .pth: clip_file.py)."""

from __future__ import annotations

import inspect as signature
import re
from dataclasses import dataclass, replace
from pathlib import Path

from safetensors import SafetensorError, safe_open

from library.errors import ModelError
from library.models import wan_vae_keys
from library.models.families import wan_vae_file
from library.models.families.folder_loader import CheckedFolder, check_width, t5_tokenizer
from library.models.families.name_table import count_numbered
from library.models.families.spec import ComponentFile, FamilySpec, MainFile, SpecPart
from library.models.families.spec_loader import claimer, spec_for
from library.models.families.wan.clip_file import plan_clip_file
from library.models.families.wan.keys import TABLE, TABLE_CLIP
from library.models.families.wan.t5_file import plan_t5_file
from library.models.image_encoders.clip_vision_file import VIT_H
from library.models.model_files import read_json
from library.models.text_encoders.t5 import T5TokenizerPlaces
from library.models.text_encoders.umt5 import umt5_xxl_config

FAMILY = "Wan"
HEAD_DIM = 128  # every release's attention head width (the shapes do not show it)
PIXEL_MULTIPLE = 16  # the VAE's 8 times the 1x2x2 patches
TI2V_CHANNELS = 48  # Wan 2.2's VAE (TI2V-5B's) latent channels
TEMPORAL = 4  # the VAE's frames per latent frame after the first
I2V_PIPELINE = "WanImageToVideoPipeline"
IMAGE_ENCODER, IMAGE_PROCESSOR = "image_encoder", "image_processor"  # Wan 2.1 I2V's subfolders
# An image-to-video transformer's input: the noisy latents, the first frame's 4 mask channels
# and its 16 latent channels (diffusers' WanImageToVideoPipeline.prepare_latents)
I2V_CHANNELS = 16 + 4 + 16
DISCRETE_FLOW_SHIFT = 3.0  # musubi-tuner's Wan guide for training (and the 480p sampling shift)
TI2V_SAMPLE_SHIFT = 5.0  # TI2V-5B's released scheduler (Wan-AI's sample_shift, diffusers' folder)
PLACES = T5TokenizerPlaces(
    repos=(
        ("google/umt5-xxl", ""),
        ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "tokenizer"),
        ("Wan-AI/Wan2.1-T2V-14B-Diffusers", "tokenizer"),
    ),  # fmt: skip
    sub="tokenizer",
    copy_from="a Wan diffusers folder's tokenizer/, or google/umt5-xxl's files",
)
WHATS = {
    "t5": "the umT5-XXL text encoder (umt5_xxl_fp16.safetensors or Wan-AI's "
    "models_t5_umt5-xxl-enc-bf16.pth)",
    "vae": "the Wan VAE (wan_2.1_vae.safetensors, or wan2.2_vae.safetensors for TI2V-5B)",
    "clip": "Wan 2.1 I2V-14B's CLIP vision encoder (clip_vision_h.safetensors or Wan-AI's "
    "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth)",
}


def scheduler_config(shift: float = DISCRETE_FLOW_SHIFT) -> dict:
    """The released scheduler/ (UniPCMultistepScheduler over flow sigmas at ``shift``)."""
    return {"num_train_timesteps": 1000, "prediction_type": "flow_prediction",
            "use_flow_sigmas": True, "flow_shift": shift, "solver_order": 2,
            "solver_type": "bh2", "predict_x0": True, "lower_order_final": True,
            "final_sigmas_type": "zero", "timestep_spacing": "linspace"}  # fmt: skip


def vae_config() -> dict:
    """AutoencoderKLWan kwargs of the released Wan 2.1 VAE: the defaults."""
    from diffusers import AutoencoderKLWan

    parameters = signature.signature(AutoencoderKLWan.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not signature.Parameter.empty}


# The Wan 2.2 VAE's per-channel latent statistics (Wan-AI's vae2_2.py, diffusers'
# Wan2.2-TI2V-5B-Diffusers vae/config.json)
_TI2V_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542,
    0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,
    0.2665, -0.2108, -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899,
    -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)  # fmt: skip
_TI2V_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894,
    1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146,
    0.8986, 0.5659, 0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709,
    0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537,
    0.5444, 0.4089, 0.7468, 0.7744,
)  # fmt: skip


def ti2v_vae_config() -> dict:
    """AutoencoderKLWan kwargs of the released Wan 2.2 VAE (TI2V-5B's): residual levels over
    2x2 pixel patches, 48 channels, 16 times smaller sides."""
    return {
        **vae_config(), "base_dim": 160, "decoder_base_dim": 256, "z_dim": TI2V_CHANNELS,
        "is_residual": True, "in_channels": 12, "out_channels": 12, "patch_size": 2,
        "scale_factor_spatial": 16, "latents_mean": list(_TI2V_MEAN),
        "latents_std": list(_TI2V_STD),
    }  # fmt: skip


def plan_vae_file(file):
    """The VAE file (vae): Wan 2.1's or Wan 2.2's (TI2V-5B's), in Wan's names or diffusers'."""
    released = ti2v_vae_config if wan_vae_keys.is_residual(file.keys()) else vae_config
    return wan_vae_file.plan_vae(file, "vae", WHATS["vae"], released, "Wan VAE", "AutoencoderKLWan")


def transformer_config(plain) -> dict:
    """WanTransformer3DModel kwargs for diffusers-named shapes (KeyError naming a key the sizes
    are read from); the head width is the releases' 128."""
    width, in_channels, *patch = plain["patch_embedding.weight"]
    if width % HEAD_DIM:
        raise KeyError(f"a transformer {width} wide, not a multiple of the {HEAD_DIM}-wide heads")
    return {
        "patch_size": tuple(patch), "num_attention_heads": width // HEAD_DIM,
        "attention_head_dim": HEAD_DIM, "in_channels": in_channels,
        "out_channels": plain["proj_out.weight"][0] // (patch[0] * patch[1] * patch[2]),
        "text_dim": plain["condition_embedder.text_embedder.linear_1.weight"][1],
        "freq_dim": plain["condition_embedder.time_embedder.linear_1.weight"][1],
        "ffn_dim": plain["blocks.0.ffn.net.0.proj.weight"][0],
        "num_layers": count_numbered(plain, "blocks"),
        "cross_attn_norm": "blocks.0.norm2.weight" in plain,
        "qk_norm": "rms_norm_across_heads" if "blocks.0.attn1.norm_q.weight" in plain else None,
        "eps": 1e-6, "rope_max_seq_len": 1024, **_image_sizes(plain),
    }  # fmt: skip


def _image_sizes(plain) -> dict:
    """An image-to-video transformer's CLIP state width and image key/value input (Wan 2.1
    I2V-14B's), None for the others."""
    norm = plain.get("condition_embedder.image_embedder.norm1.weight")
    added = plain.get("blocks.0.attn2.add_k_proj.weight")
    return {"image_dim": norm and norm[0], "added_kv_proj_dim": added and added[1]}


# musubi-tuner's --task -> what its released transformer's config says beyond the shared sizes
_RELEASED = {
    "t2v-1.3B": {"num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30},
    "t2v-14B": {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40},
    "t2v-A14B": {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40},
    "ti2v-5B": {"num_attention_heads": 24, "ffn_dim": 14336, "num_layers": 30,
                "in_channels": 48, "out_channels": 48},
    "i2v-A14B": {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40,
                 "in_channels": 36},
    "i2v-14B": {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40,
                "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120},
}  # fmt: skip
IMAGE_TASKS = ("i2v-A14B", "i2v-14B")  # a first frame's channels after the noisy latents


def released_transformer_config(task: str) -> dict:
    """WanTransformer3DModel kwargs of the released transformer of ``task``."""
    return {
        "patch_size": (1, 2, 2), "attention_head_dim": HEAD_DIM, "in_channels": 16,
        "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024,
        **_RELEASED[task],
    }  # fmt: skip


TASK_WIDTHS = {task: sizes["num_attention_heads"] * HEAD_DIM for task, sizes in _RELEASED.items()}


def check_task(checked) -> None:
    """[flow] task (musubi-tuner's) names a model of the transformer's input (a first frame's
    or not) and width."""
    task = getattr(checked.flow, "task", None)
    config = checked.part_config("transformer")
    width = config["num_attention_heads"] * config["attention_head_dim"]
    first_frame = config["in_channels"] == I2V_CHANNELS
    if task is not None and (task in IMAGE_TASKS) != first_frame:
        raise ModelError(
            f"task = {task!r} and {checked.part_source('transformer')} takes "
            f"{config['in_channels']} input channels ({'an' if first_frame else 'no'} image-to-"
            "video first frame); set the task of that model, or remove it"
        )
    reads_clip = config.get("image_dim") is not None
    if task in IMAGE_TASKS and (task == "i2v-14B") != reads_clip:
        raise ModelError(
            f"task = {task!r} and {checked.part_source('transformer')} "
            f"{'reads' if reads_clip else 'takes no'} CLIP image states (Wan 2.1 I2V-14B's "
            "input); set the task of that model, or remove it"
        )
    if task is not None and TASK_WIDTHS[task] != width:
        fits = [name for name, wide in TASK_WIDTHS.items() if wide == width] or ["none"]
        raise ModelError(
            f"task = {task!r} is a {TASK_WIDTHS[task]}-wide Wan transformer and "
            f"{checked.part_source('transformer')} is {width} wide; set task to "
            f"{' or '.join(fits)}, or remove it"
        )


@dataclass(frozen=True)
class Facts:
    """The sampling scheduler (UniPC's config), the folder's expert boundary (Wan 2.2 A14B) and
    whether its transformer takes a timestep per token (Wan 2.2 TI2V-5B: expand_timesteps)."""

    scheduler: dict
    boundary_ratio: float | None = None
    expand_timesteps: bool = False
    first_frame: bool = False  # Wan 2.2 I2V-A14B: the first frame's latents beside the noisy ones
    image_states: bool = False  # Wan 2.1 I2V-14B: and the CLIP states of the first frame


ONLY_T2V = (
    "difftune trains Wan 2.1 text to video (T2V 1.3B / 14B) and image to video (I2V-14B, with "
    "its CLIP image encoder), the Wan 2.2 T2V-A14B and I2V-A14B experts and Wan 2.2 TI2V-5B as "
    "text to video; give one of those"
)
# Keys of the image-to-video transformers' image input (the original and diffusers' names)
_IMAGE_INPUT = (".cross_attn.k_img.", ".attn2.add_k_proj.")


def _file_reads_images(path: Path) -> bool:
    """A transformer file of an image-to-video model that reads CLIP image states (Wan 2.1
    I2V-14B), from its header; False for a file that is not such a safetensors file."""
    try:
        with safe_open(str(path), "pt") as f:
            return any(mark in key for key in f.keys() for mark in _IMAGE_INPUT)  # noqa: SIM118
    except (SafetensorError, OSError):
        return False


def is_ti2v_file(path: Path) -> bool:
    """A transformer file on TI2V-5B's 48 latent channels (its patch embedding's input, named
    alike in the original and diffusers' names), read from the header; False for a file that
    is not such a safetensors file (the loader names what it is)."""
    try:
        with safe_open(str(path), "pt") as f:
            key = next((k for k in f.keys() if k.endswith("patch_embedding.weight")), None)  # noqa: SIM118
            return key is not None and f.get_slice(key).get_shape()[1] == TI2V_CHANNELS
    except (SafetensorError, OSError, IndexError):
        return False


def refuse_other_tasks(checked, expand_timesteps: bool = False) -> None:
    """ModelError for a folder or file of another task: CLIP image input (Wan 2.1 I2V), latents
    of another VAE, or TI2V-5B's 48 channels without the per-token timesteps its diffusers
    folder declares (expand_timesteps in model_index.json). Wan 2.2 I2V-A14B's 36 channels
    (the VAE's 16 and the first frame's 20) pass."""
    config = {**transformer_defaults(), **checked.part_config("transformer")}
    source = checked.part_source("transformer")
    reads_clip = config.get("image_dim") is not None or config.get("added_kv_proj_dim") is not None
    if reads_clip != reads_image_states(checked):
        raise ModelError(
            f"{source} is Wan 2.1's image-to-video transformer (I2V-14B), which reads CLIP image "
            f"states, and {checked.model_dir} gives no CLIP vision encoder; give its "
            "WanImageToVideoPipeline folder with image_encoder/ and image_processor/ (or set "
            "clip in [flow] to clip_vision_h.safetensors)"
            if reads_clip else
            f"{checked.model_dir} has a CLIP image encoder and {source} reads no image states "
            f"(not Wan 2.1 I2V-14B); {ONLY_T2V}"
        )  # fmt: skip
    channels = checked.part_config("vae").get("z_dim", 16)
    if config["in_channels"] not in (channels, 2 * channels + 4):
        raise ModelError(
            f"{source} takes {config['in_channels']} latent channels and the VAE makes "
            f"{channels} (Wan 2.2 TI2V-5B or an image-to-video model); {ONLY_T2V}"
        )
    if channels == TI2V_CHANNELS and not expand_timesteps:
        raise ModelError(
            f"{source} is Wan 2.2 TI2V-5B without its folder's expand_timesteps (per-token "
            f"timesteps); {ONLY_T2V}"
        )


def reads_image_states(checked) -> bool:
    """The checked model declares a CLIP image encoder (Wan 2.1 I2V-14B's spec)."""
    return any(part.sub == IMAGE_ENCODER for part in checked.spec.parts)


def transformer_defaults() -> dict:
    """WanTransformer3DModel's defaults (a folder's config.json may leave keys out)."""
    from diffusers import WanTransformer3DModel

    parameters = signature.signature(WanTransformer3DModel.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not signature.Parameter.empty}


def inspect_parts(checked) -> Facts:
    """umT5's width is the transformer's text input, the task text to video; a folder's
    scheduler, boundary_ratio and expand_timesteps (single files: the released scheduler; a
    transformer on 48 channels is TI2V-5B, whose timesteps are per token)."""
    folder = isinstance(checked, CheckedFolder)
    index = read_json(checked.model_dir / "model_index.json") if folder else {}
    channels = checked.part_config("transformer").get("in_channels")
    expands = bool(index.get("expand_timesteps")) if folder else channels == TI2V_CHANNELS
    refuse_other_tasks(checked, expands)
    check_width(checked, "text_encoder", checked.part_config("text_encoder")["d_model"],
                "text_dim", "umT5 states", "set t5 in [flow] to umT5-XXL's file")  # fmt: skip
    check_task(checked)
    image_states = reads_image_states(checked)
    if image_states:
        check_width(checked, IMAGE_ENCODER, checked.part_config(IMAGE_ENCODER)["hidden_size"],
                    "image_dim", "image states",
                    "set clip in [flow] to the CLIP ViT-H file (clip_vision_h.safetensors)")  # fmt: skip
    elif getattr(checked.flow, "clip", None):
        raise ModelError(
            f"clip is set and {checked.part_source('transformer')} reads no CLIP image states "
            "(only Wan 2.1 I2V-14B's does); remove clip from [flow]"
        )
    first_frame = checked.part_config("transformer")["in_channels"] == I2V_CHANNELS
    if not folder:
        shift = TI2V_SAMPLE_SHIFT if expands else DISCRETE_FLOW_SHIFT
        return Facts(scheduler_config(shift), expand_timesteps=expands, first_frame=first_frame,
                     image_states=image_states)  # fmt: skip
    scheduler = read_json(checked.model_dir / "scheduler" / "scheduler_config.json")
    scheduler = {k: v for k, v in scheduler.items() if not k.startswith("_")}
    return Facts(scheduler, index.get("boundary_ratio"), bool(index.get("expand_timesteps")),
                 first_frame, image_states)  # fmt: skip


SPEC = FamilySpec(
    family=FAMILY,
    pipeline="WanPipeline",
    parts=(
        SpecPart(
            "denoiser", "transformer", "diffusers:WanTransformer3DModel",
            label="Wan transformer",
            main=MainFile(
                names=TABLE,
                original_marks=("text_embedding.0.weight", "blocks.0.cross_attn.q.weight"),
                diffusers_marks=("condition_embedder.text_embedder.linear_1.weight",
                                 "blocks.0.attn2.to_q.weight"),
                config_from_shapes=transformer_config,
                damaged=re.compile(r'"(model\.diffusion_model\.)?(text_embedding\.0|'
                                   r'condition_embedder\.text_embedder)\.'),
                example="wan2.1_t2v_1.3B_fp16.safetensors (Comfy-Org/Wan_2.1_ComfyUI_repackaged)",
            ),
        ),
        SpecPart(
            "vae", "vae", "diffusers:AutoencoderKLWan", base=vae_config,
            file=ComponentFile("vae", "[model]", WHATS["vae"], plan_vae_file),
        ),
        SpecPart(
            "text_encoder", "text_encoder", "transformers:UMT5EncoderModel", base=umt5_xxl_config,
            file=ComponentFile("t5", "[flow]", WHATS["t5"], plan_t5_file, pickles=True),
        ),
    ),
    tokenizers=(t5_tokenizer("tokenizer", "text_encoder", PLACES.find, PLACES.missing),),
    inspect=inspect_parts,
    other={"scheduler": "scheduler_config.json"},
)  # fmt: skip
# Wan 2.2 I2V-A14B's folders: the same parts under WanImageToVideoPipeline (its image_encoder
# and image_processor null)
SPEC_I2V = replace(SPEC, pipeline=I2V_PIPELINE)
# Wan 2.1 I2V-14B's: its transformer reads CLIP image states too (TABLE_CLIP's names), from the
# CLIP vision tower in image_encoder/ (musubi-tuner's clip file) with image_processor/'s
# preprocessing (single files: CLIP ViT-H's, image_encoders/clip_vision.py)
SPEC_I2V_CLIP = replace(
    SPEC_I2V,
    parts=(
        replace(SPEC.denoiser, main=replace(SPEC.main, names=TABLE_CLIP, example=(
            "wan2.1_i2v_480p_14B_fp16.safetensors (Comfy-Org/Wan_2.1_ComfyUI_repackaged)"))),
        *SPEC.parts[1:],
        SpecPart(
            "image_encoder", IMAGE_ENCODER, "transformers:CLIPVisionModel",
            base=lambda: dict(VIT_H), label="Wan CLIP image encoder",
            file=ComponentFile("clip", "[flow]", WHATS["clip"], lambda file: plan_clip_file(
                file, "clip", IMAGE_ENCODER, WHATS["clip"]), pickles=True),
        ),
    ),
    other={**SPEC.other, IMAGE_PROCESSOR: "preprocessor_config.json"},
)  # fmt: skip
SPECS = (SPEC, SPEC_I2V, SPEC_I2V_CLIP)
claims_wan = claimer(*SPECS)


def model_spec(model) -> FamilySpec:
    """The spec of ``model``: Wan 2.1 I2V-14B's for a WanImageToVideoPipeline folder with an
    image encoder or a transformer file that reads image states, else by the folder's
    pipeline (spec_for)."""
    main = Path(model.pretrained_model_name_or_path).expanduser()
    if main.is_file():
        return SPEC_I2V_CLIP if _file_reads_images(main) else SPEC
    index = read_json(main / "model_index.json") if (main / "model_index.json").is_file() else {}
    if index.get("_class_name") == I2V_PIPELINE and (index.get(IMAGE_ENCODER) or [None])[0]:
        return SPEC_I2V_CLIP
    return spec_for(SPECS[:2], model)
