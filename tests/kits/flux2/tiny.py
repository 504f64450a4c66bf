"""Tiny FLUX.2 [klein] components and a tiny Flux2KleinPipeline folder, built under a seed.

The modules keep the released layout and its proportions (double then single blocks, the
32-channel-style VAE with its BatchNorm statistics, a Qwen3 causal LM deep enough for the
pipeline's layers 9, 18 and 27, whose three states make the transformer's text width) at a
fraction of the size; ``Flux2KleinPipeline.from_pretrained(folder)`` reads it offline. The
tokenizer is the committed tiny Qwen3 one (tests/assets/qwen3_tokenizer).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import torch

from library.models.families.flux2.spec import SCHEDULER_CONFIG, TEXT_LAYERS
from tests.kits.flux.tiny import build_seeded
from tools.make_test_assets import ASSETS_DIR

TOKENIZER = ASSETS_DIR / "qwen3_tokenizer"
TEXT_WIDTH = 8
LATENT_CHANNELS = 4  # the released VAE's 32, patched to 4 x 32 = 128 transformer channels


@functools.cache
def vocab_size() -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(TOKENIZER)))


def transformer_config(dev: bool = False) -> dict:
    """Flux2Transformer2DModel kwargs: 2 double + 3 single blocks, 2 heads of 16, klein's
    missing guidance input (dev's guidance embedding); the text width is three text states."""
    return dict(patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=2, num_single_layers=3,
                attention_head_dim=16, num_attention_heads=2,
                joint_attention_dim=len(TEXT_LAYERS["klein"]) * TEXT_WIDTH,
                timestep_guidance_channels=32, mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4),
                rope_theta=2000, guidance_embeds=dev)  # fmt: skip


def vae_config() -> dict:
    return dict(block_out_channels=(8, 16, 16, 16), layers_per_block=1, latent_channels=LATENT_CHANNELS,
                norm_num_groups=4, sample_size=64)  # fmt: skip


def text_encoder_config() -> dict:
    return dict(vocab_size=vocab_size(), hidden_size=TEXT_WIDTH, intermediate_size=16,
                num_hidden_layers=28, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                max_position_embeddings=1024, tie_word_embeddings=True)  # fmt: skip


# A chat template of Mistral's shape (system prompt, then instructions) over list contents: dev's
# tokenizer (the released folder's is a Pixtral processor, whose tokenizer reads the same way).
MISTRAL_TEMPLATE = (
    "{%- for message in messages -%}{%- if message['role'] == 'system' -%}[SYSTEM_PROMPT]"
    "{{ message['content'][0]['text'] }}[/SYSTEM_PROMPT]{%- else -%}[INST]"
    "{%- for part in message['content'] -%}{{ part['text'] }}{%- endfor -%}[/INST]"
    "{%- endif -%}{%- endfor -%}"
)


def mistral3_encoder():
    """A tiny Mistral3ForConditionalGeneration, deep enough for dev's layers 10, 20, 30."""
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralVisionConfig,
    )

    text = MistralConfig(vocab_size=vocab_size(), hidden_size=TEXT_WIDTH, intermediate_size=16,
                         num_hidden_layers=31, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=4, max_position_embeddings=1024)  # fmt: skip
    vision = PixtralVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, head_dim=4, image_size=32, patch_size=16)  # fmt: skip
    config = Mistral3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                            spatial_merge_size=1)  # fmt: skip
    return Mistral3ForConditionalGeneration(config)


def _with_statistics(vae):
    """The VAE's BatchNorm running statistics away from (0, 1), so the normalisation shows."""
    with torch.no_grad():
        vae.bn.running_mean.copy_(0.3 * torch.randn(vae.bn.num_features))
        vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.num_features))
    return vae


def build_tiny_flux2_components(seed: int = 0, dev: bool = False) -> dict:
    """transformer, vae and text_encoder (Qwen3ForCausalLM; dev: Mistral 3) drawn under
    ``seed``."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    def text():
        return mistral3_encoder() if dev else Qwen3ForCausalLM(Qwen3Config(**text_encoder_config()))

    builders = {
        "transformer": lambda: Flux2Transformer2DModel(**transformer_config(dev)),
        "vae": lambda: _with_statistics(AutoencoderKLFlux2(**vae_config())),
        "text_encoder": text,
    }
    return build_seeded(builders, seed)


def model_index(distilled: bool, dev: bool = False) -> dict:
    import diffusers

    if dev:
        encoder = "Mistral3ForConditionalGeneration"
        return {**model_index(False), "_class_name": "Flux2Pipeline",
                "text_encoder": ["transformers", encoder]}  # fmt: skip
    index = {
        "_class_name": "Flux2KleinPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2TokenizerFast"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }
    return {**index, "is_distilled": True} if distilled else index


def write_tokenizer(path: Path, dev: bool = False) -> Path:
    """The tiny tokenizer in the folder ``path`` (dev: with MISTRAL_TEMPLATE); returns it."""
    shutil.copytree(TOKENIZER, path, dirs_exist_ok=True)
    if dev:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
        tokenizer.chat_template = MISTRAL_TEMPLATE
        tokenizer.save_pretrained(path)
    return path


def write_tiny_flux2_folder(path: str | Path, variant: str = "klein-base", seed: int = 0) -> Path:
    """A tiny FLUX.2 ``variant`` ("klein-base", "klein": distilled, or "dev") as a diffusers
    Flux2KleinPipeline / Flux2Pipeline folder (float32); returns ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dev = variant == "dev"
    for name, module in build_tiny_flux2_components(seed, dev).items():
        module.save_pretrained(path / name)
    write_tokenizer(path / "tokenizer", dev)
    FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG).save_pretrained(path / "scheduler")
    index = model_index(distilled=variant == "klein", dev=dev)
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path
