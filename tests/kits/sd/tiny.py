"""Tiny SD 1.x / 2.x / SDXL models and a tiny CLIP tokenizer, built from small configs under a seed.

They have the real module layout (cross-attention transformer blocks, ResNet blocks, down- and
upsamplers, CLIP text encoders; for SDXL the second encoder with projection and the UNet's
pooled-text + size embedding) at a fraction of the size, so the example and the tests exercise
the same code paths as a real SD 1.5 / 2.x / SDXL model, fully offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.families.sd.checkpoint_layout import CONFIGS_DIR

TINY_SIZE = 64  # pixels; the tiny VAE downsamples by 8 like the real one
_SPECIAL = ("<|startoftext|>", "<|endoftext|>")


def _byte_alphabet() -> list[str]:
    """The 256 printable stand-ins CLIP's byte-level BPE uses for raw bytes (GPT-2's table)."""
    keep = list(range(ord("!"), ord("~") + 1))
    keep += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_tokenizer(folder: str | Path) -> Path:
    """Write a character-level CLIP tokenizer (vocab.json, merges.txt, configs) to ``folder``.

    No merges: every character is one token, which keeps the files small (~20 KB) while using
    the same tokenizer class, special tokens and 77-token padding as SD's CLIP tokenizer.
    """
    alphabet = _byte_alphabet()
    return write_clip_tokenizer_files(folder, alphabet + [c + "</w>" for c in alphabet])


def write_clip_tokenizer_files(
    folder: str | Path, base: list[str], merges: list[tuple[str, str]] = ()
) -> Path:
    """CLIP tokenizer files in ``folder``: the vocabulary is ``base``, then each merge's
    result, then CLIP's special tokens; ``merges`` in the order the tokenizer applies them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokens = [*base, *(a + b for a, b in merges), *_SPECIAL]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2", *(f"{a} {b}" for a, b in merges)]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = {
        "tokenizer_class": "CLIPTokenizer",
        "model_max_length": 77,
        "bos_token": _SPECIAL[0],
        "eos_token": _SPECIAL[1],
        "unk_token": _SPECIAL[1],
        "pad_token": _SPECIAL[1],
        "do_lower_case": True,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2), encoding="utf-8")
    return folder


def tiny_vocab_size() -> int:
    return 2 * 256 + len(_SPECIAL)


def tiny_unet_config(family: str = "sd1") -> dict:
    """UNet2DConditionModel kwargs: two levels, one cross-attention level, like SD at small width."""
    sd2 = family.startswith("sd2")
    return {
        "sample_size": TINY_SIZE // 8,
        "in_channels": 4,
        "out_channels": 4,
        "layers_per_block": 1,
        "block_out_channels": (32, 64),
        "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
        "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
        "cross_attention_dim": 32,
        "attention_head_dim": (2, 4) if sd2 else 8,
        "use_linear_projection": sd2,
        "norm_num_groups": 32,
    }


def tiny_vae_config() -> dict:
    """AutoencoderKL kwargs with four levels, so latents are 1/8 of the image like SD's VAE."""
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ("DownEncoderBlock2D",) * 4,
        "up_block_types": ("UpDecoderBlock2D",) * 4,
        "block_out_channels": (8, 8, 16, 16),
        "layers_per_block": 1,
        "latent_channels": 4,
        "norm_num_groups": 8,
        "sample_size": TINY_SIZE,
        "scaling_factor": 0.18215,
    }


def tiny_text_config(family: str = "sd1") -> dict:
    """CLIPTextConfig kwargs; SD 2.x uses GELU (OpenCLIP), SD 1.x quick-GELU (OpenAI CLIP)."""
    return {
        "vocab_size": tiny_vocab_size(),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 77,
        "hidden_act": "gelu" if family.startswith("sd2") else "quick_gelu",
        "bos_token_id": tiny_vocab_size() - 2,
        "eos_token_id": tiny_vocab_size() - 1,
        "pad_token_id": tiny_vocab_size() - 1,
    }


def tiny_scheduler_config(family: str = "sd1") -> dict:
    """SD's training noise schedule; SD 2.x 768-v predicts v."""
    return {
        "num_train_timesteps": 1000,
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "scaled_linear",
        "clip_sample": False,
        "set_alpha_to_one": False,
        "steps_offset": 1,
        "prediction_type": "v_prediction" if family == "sd2-v" else "epsilon",
    }


def build_tiny_components(family: str = "sd1", seed: int = 0) -> dict:
    """Build unet, vae, text_encoder and scheduler in memory with weights drawn under ``seed``.

    ``family`` "sdxl" also gives text_encoder_2 (see ``build_tiny_sdxl_components``).
    """
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    if family == "sdxl":
        return build_tiny_sdxl_components(seed)
    if family not in ("sd1", "sd2", "sd2-v"):
        raise ValueError(f"unknown tiny family {family!r}")
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**tiny_unet_config(family))
    vae = AutoencoderKL(**tiny_vae_config())
    text_encoder = CLIPTextModel(CLIPTextConfig(**tiny_text_config(family)))
    scheduler = DDIMScheduler(**tiny_scheduler_config(family))
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder, "scheduler": scheduler}


def save_tiny_model(folder: str | Path, family: str = "sd1", seed: int = 0) -> Path:
    """Write a tiny model as a diffusers pipeline folder (model_index.json + components).

    ``family`` "sdxl" writes a StableDiffusionXLPipeline folder (text_encoder_2, tokenizer_2).
    """
    folder = Path(folder)
    if family == "sdxl":
        return _save_tiny_sdxl(folder, seed)
    parts = build_tiny_components(family, seed)
    return save_sd_pipeline(folder, parts, write_tiny_tokenizer(folder / "tokenizer"))


def save_sd_pipeline(folder: Path, parts: dict, tokenizer_dir: Path) -> Path:
    """Write ``parts`` (unet, vae, text_encoder, scheduler) and the tokenizer files in
    ``tokenizer_dir`` (inside ``folder``) as a StableDiffusionPipeline folder without a safety
    checker, whose files depend only on the weights."""
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPTokenizer

    pipe = StableDiffusionPipeline(
        **parts,
        tokenizer=CLIPTokenizer.from_pretrained(str(tokenizer_dir)),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    _drop_load_state(folder / "tokenizer" / "tokenizer_config.json")
    return folder


def _drop_load_state(config_file: Path) -> None:
    """Remove the how-it-was-loaded keys transformers saves into tokenizer_config.json.

    "local_files_only" follows HF_HUB_OFFLINE in the saving process; without this the written
    folder would depend on the environment rather than only on the seed.
    """
    config = json.loads(config_file.read_text(encoding="utf-8"))
    for key in ("local_files_only", "is_local"):
        config.pop(key, None)
    text = json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    config_file.write_text(text, encoding="utf-8")


# --- SDXL -------------------------------------------------------------------------------------

# Two encoders of different widths, so a mix-up of their outputs changes shapes and fails.
TINY_SDXL_TEXT_WIDTHS = (32, 48)  # hidden size of text_encoder (CLIP-L), text_encoder_2 (bigG)
TINY_SDXL_PROJECTION_DIM = 24  # text_encoder_2's pooled (projected) width
TINY_SDXL_TIME_EMBED_DIM = 8  # addition_time_embed_dim: per size number


def tiny_sdxl_unet_config() -> dict:
    """UNet2DConditionModel kwargs in SDXL's pattern at small width.

    As in SDXL: the first level has no attention, the deeper one has two transformer layers per
    block, linear projections, two ResNets per level, and the "text_time" added embedding fed
    with the pooled text embedding plus six size numbers (original h/w, crop top/left, target
    h/w), each embedded in ``addition_time_embed_dim`` channels.
    """
    return {
        "sample_size": TINY_SIZE // 8,
        "in_channels": 4,
        "out_channels": 4,
        "layers_per_block": 2,
        "block_out_channels": (32, 64),
        "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"),
        "transformer_layers_per_block": (1, 2),
        "attention_head_dim": (2, 4),
        "use_linear_projection": True,
        "cross_attention_dim": sum(TINY_SDXL_TEXT_WIDTHS),
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": TINY_SDXL_TIME_EMBED_DIM,
        "projection_class_embeddings_input_dim": TINY_SDXL_PROJECTION_DIM
        + 6 * TINY_SDXL_TIME_EMBED_DIM,
        "norm_num_groups": 32,
    }


def _released_sdxl_vae_scale() -> float:
    """The scaling_factor of SDXL's released VAE, from the shipped config (library/models/configs)."""
    config = CONFIGS_DIR / "sdxl-base" / "vae.json"
    return json.loads(config.read_text(encoding="utf-8"))["scaling_factor"]


def tiny_sdxl_text_configs() -> tuple[dict, dict]:
    """CLIPTextConfig kwargs of text_encoder (quick-GELU, like CLIP-L) and text_encoder_2
    (GELU and a projection, like OpenCLIP bigG)."""
    first = {**tiny_text_config("sd1"), "hidden_size": TINY_SDXL_TEXT_WIDTHS[0]}
    second = {
        **tiny_text_config("sd2"),
        "hidden_size": TINY_SDXL_TEXT_WIDTHS[1],
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "projection_dim": TINY_SDXL_PROJECTION_DIM,
    }
    return first, second


def build_tiny_sdxl_components(seed: int = 0) -> dict:
    """unet, vae, text_encoder, text_encoder_2 and scheduler of a tiny SDXL, drawn under ``seed``.

    The VAE carries SDXL's latent scale (0.13025); the scheduler is SDXL's Euler sampler over the
    same training noise schedule as SD.
    """
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    first, second = tiny_sdxl_text_configs()
    unet = UNet2DConditionModel(**tiny_sdxl_unet_config())
    vae = AutoencoderKL(**{**tiny_vae_config(), "scaling_factor": _released_sdxl_vae_scale()})
    text_encoder = CLIPTextModel(CLIPTextConfig(**first))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**second))
    schedule = {**tiny_scheduler_config("sd1"), "timestep_spacing": "leading"}
    schedule.pop("clip_sample")
    schedule.pop("set_alpha_to_one")
    scheduler = EulerDiscreteScheduler(**schedule)
    return {
        "unet": unet,
        "vae": vae,
        "text_encoder": text_encoder,
        "text_encoder_2": text_encoder_2,
        "scheduler": scheduler,
    }


def _save_tiny_sdxl(folder: Path, seed: int) -> Path:
    """A StableDiffusionXLPipeline folder; both tokenizers are the tiny one, as in SDXL where
    both encoders share CLIP's vocabulary."""
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    parts = build_tiny_sdxl_components(seed)
    tokenizers = {}
    for name in ("tokenizer", "tokenizer_2"):
        tokenizers[name] = CLIPTokenizer.from_pretrained(write_tiny_tokenizer(folder / name))
    pipe = StableDiffusionXLPipeline(**parts, **tokenizers, add_watermarker=False)
    pipe.save_pretrained(folder, safe_serialization=True)
    for name in tokenizers:
        _drop_load_state(folder / name / "tokenizer_config.json")
    return folder
