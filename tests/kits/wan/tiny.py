"""Tiny Wan 2.1 components and a tiny diffusers WanPipeline folder, built under a seed.

The components have Wan 2.1 T2V's module layout (the 3-D patch embedding and blocks of self- and
cross-attention with q/k RMS norms across heads, the Wan VAE, umT5's encoder with a position
bias in every block) at a fraction of the size, for offline tests; ``WanPipeline.from_pretrained``
reads the folder without a network. umT5's tokenizer is a T5 tokenizer (tokenizer.json with pad
0, end 1), written by tiny_tokenizer.py (``python -m tests.kits.wan.tiny_tokenizer <folder>``).
"""

from __future__ import annotations

import json
from pathlib import Path

from library.models.families.wan.spec import scheduler_config
from tests.kits.flux.tiny import build_seeded
from tests.kits.wan.tiny_tokenizer import tiny_umt5_vocab_size, write_tiny_umt5_tokenizer

TEXT_WIDTH = 32


def transformer_config() -> dict:
    """WanTransformer3DModel kwargs: two blocks of 2 heads of 8, umT5's tiny width."""
    return {
        "patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 8,
        "in_channels": 16, "out_channels": 16, "text_dim": TEXT_WIDTH, "freq_dim": 16,
        "ffn_dim": 32, "num_layers": 2, "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "image_dim": None,
        "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
    }  # fmt: skip


def text_encoder_config() -> dict:
    """UMT5Config kwargs: two gated-GELU layers of 4 heads, as many ids as the tiny tokenizer."""
    return {
        "vocab_size": tiny_umt5_vocab_size(), "d_model": TEXT_WIDTH, "d_kv": 8, "d_ff": 64,
        "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
        "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16,
        "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
    }  # fmt: skip


def vae_config() -> dict:
    return {"base_dim": 8}


def build_tiny_wan_components(seed: int = 0) -> dict:
    """transformer, vae and text_encoder (UMT5EncoderModel) drawn under ``seed``."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    builders = {
        "transformer": lambda: WanTransformer3DModel(**transformer_config()),
        "vae": lambda: AutoencoderKLWan(**vae_config()),
        "text_encoder": lambda: UMT5EncoderModel(UMT5Config(**text_encoder_config())),
    }
    return build_seeded(builders, seed)


def model_index() -> dict:
    """model_index.json of a Wan 2.1 T2V folder."""
    import diffusers

    return {
        "_class_name": "WanPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }


def write_tiny_wan_folder(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny Wan 2.1 T2V as a diffusers WanPipeline folder; returns ``path``."""
    from diffusers import UniPCMultistepScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, module in build_tiny_wan_components(seed).items():
        module.save_pretrained(path / name)
    write_tiny_umt5_tokenizer(path / "tokenizer")
    UniPCMultistepScheduler(**scheduler_config()).save_pretrained(path / "scheduler")
    text = json.dumps(model_index(), indent=2) + "\n"
    (path / "model_index.json").write_text(text, encoding="utf-8")
    return path


def write_tiny_wan_experts_folder(
    path: str | Path, boundary_ratio: float | None = 0.875, seed: int = 0
) -> Path:
    """A tiny Wan 2.2 T2V-A14B folder: the high-noise transformer in transformer/ (the Wan 2.1
    folder's), a low-noise one drawn under ``seed + 1`` in transformer_2/, and
    ``boundary_ratio`` (None: left out) in model_index.json, as diffusers' A14B folders."""
    from diffusers import WanTransformer3DModel

    path = write_tiny_wan_folder(path, seed)
    low = build_seeded({"t": lambda: WanTransformer3DModel(**transformer_config())}, seed + 1)
    low["t"].save_pretrained(path / "transformer_2")
    index = {**model_index(), "transformer_2": ["diffusers", "WanTransformer3DModel"]}
    if boundary_ratio is not None:
        index["boundary_ratio"] = boundary_ratio
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path


def ti2v_vae_config() -> dict:
    """AutoencoderKLWan kwargs of a tiny Wan 2.2 VAE (TI2V-5B's): 48 latent channels, residual
    blocks over 2x2 pixel patches (12 channels in and out), 16 times smaller sides; per-channel
    statistics that are not the identity, so a missed normalisation shows."""
    return {
        "base_dim": 8, "decoder_base_dim": 8, "z_dim": 48, "is_residual": True,
        "in_channels": 12, "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
        "scale_factor_temporal": 4, "latents_mean": [0.05 * i - 1.2 for i in range(48)],
        "latents_std": [0.8 + 0.01 * i for i in range(48)],
    }  # fmt: skip


def build_tiny_wan_ti2v_components(seed: int = 0) -> dict:
    """A tiny Wan 2.2 TI2V-5B's modules: the transformer on 48 latent channels and the Wan 2.2
    VAE drawn under ``seed + 2``, umT5's encoder the Wan 2.1 kit's under ``seed``."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    config = {**transformer_config(), "in_channels": 48, "out_channels": 48}
    builders = {
        "transformer": lambda: WanTransformer3DModel(**config),
        "vae": lambda: AutoencoderKLWan(**ti2v_vae_config()),
    }
    text = build_tiny_wan_components(seed)["text_encoder"]
    return {**build_seeded(builders, seed + 2), "text_encoder": text}


def write_tiny_wan_ti2v_folder(path: str | Path, seed: int = 0) -> Path:
    """A tiny Wan 2.2 TI2V-5B folder as diffusers' (build_tiny_wan_ti2v_components), with
    ``expand_timesteps`` (its per-token timesteps) in model_index.json."""
    path = write_tiny_wan_folder(path, seed)
    for name, module in build_tiny_wan_ti2v_components(seed).items():
        module.save_pretrained(path / name)
    index = {**model_index(), "expand_timesteps": True}
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path


def write_tiny_wan_i2v_folder(path: str | Path, boundary_ratio: float = 0.9, seed: int = 0) -> Path:
    """A tiny Wan 2.2 I2V-A14B folder as diffusers' (WanImageToVideoPipeline): two experts of
    36 input channels (the noisy latents, the first frame's 4 mask and 16 latent channels) and
    16 out, no image encoder, ``boundary_ratio`` in model_index.json."""
    from diffusers import WanTransformer3DModel

    path = write_tiny_wan_folder(path, seed)
    config = {**transformer_config(), "in_channels": 36}
    builders = {
        "transformer": lambda: WanTransformer3DModel(**config),
        "transformer_2": lambda: WanTransformer3DModel(**config),
    }
    for name, module in build_seeded(builders, seed + 3).items():
        module.save_pretrained(path / name)
    index = {**model_index(), "_class_name": "WanImageToVideoPipeline",
             "transformer_2": ["diffusers", "WanTransformer3DModel"],
             "image_encoder": [None, None], "image_processor": [None, None],
             "boundary_ratio": boundary_ratio, "expand_timesteps": False}  # fmt: skip
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path


def clip_vision_config() -> dict:
    """CLIPVisionConfig kwargs: two layers of 2 heads over 16-pixel patches of 32-pixel images
    (5 tokens: the class token and 4 patches), quick_gelu as Wan 2.1's ViT-H."""
    return {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": 32, "patch_size": 16, "projection_dim": 16,
        "hidden_act": "gelu",
    }  # fmt: skip


def image_processor_config() -> dict:
    """CLIPImageProcessor kwargs at the tiny encoder's 32 pixels (the released: 224), with
    CLIP's mean and std."""
    return {
        "do_resize": True, "size": {"shortest_edge": 32}, "resample": 3, "do_center_crop": True,
        "crop_size": {"height": 32, "width": 32}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True,
    }  # fmt: skip


def write_tiny_wan_i2v_clip_folder(path: str | Path, seed: int = 0) -> Path:
    """A tiny Wan 2.1 I2V-14B folder as diffusers' (WanImageToVideoPipeline): one transformer of
    36 input channels that reads CLIP image states (image_dim, added_kv_proj_dim), a tiny
    CLIPVisionModel in image_encoder/ and its CLIPImageProcessor in image_processor/."""
    from diffusers import WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    path = write_tiny_wan_folder(path, seed)
    vision = clip_vision_config()
    config = {**transformer_config(), "in_channels": 36, "image_dim": vision["hidden_size"],
              "added_kv_proj_dim": 16}  # fmt: skip
    builders = {
        "transformer": lambda: WanTransformer3DModel(**config),
        "image_encoder": lambda: CLIPVisionModel(CLIPVisionConfig(**vision)),
    }
    for name, module in build_seeded(builders, seed + 4).items():
        module.save_pretrained(path / name)
    CLIPImageProcessor(**image_processor_config()).save_pretrained(path / "image_processor")
    index = {**model_index(), "_class_name": "WanImageToVideoPipeline",
             "image_encoder": ["transformers", "CLIPVisionModel"],
             "image_processor": ["transformers", "CLIPImageProcessor"],
             "transformer_2": [None, None], "boundary_ratio": None,
             "expand_timesteps": False}  # fmt: skip
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path
