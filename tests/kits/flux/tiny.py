"""Tiny FLUX.1 components and a tiny T5 tokenizer, built from the tiny configs under a seed.

The components have FLUX.1's module layout (double and single stream blocks, the 16-channel AE
without quant convs, CLIP-L and T5 v1.1 encoders) at a fraction of the size, for offline tests.
The CLIP tokenizer is the tiny one of tests/kits/sd/tiny.py; ``write_tiny_t5_tokenizer`` writes
the T5 one as tokenizer.json only, so neither sentencepiece nor a download is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from library.models.families.flux.shapes import T5_MAX_LENGTH, Variant
from tests.kits.flux.tiny_shapes import (
    tiny_ae_config,
    tiny_clip_config,
    tiny_t5_config,
    tiny_transformer_config,
)

# T5's special pieces and their ids: pad 0, end of sequence 1, unknown 2.
T5_SPECIAL = ("<pad>", "</s>", "<unk>")
SPACE = "\u2581"  # "▁", SentencePiece's word-start mark


def tiny_t5_pieces() -> list[str]:
    """The tiny T5 vocabulary in id order: T5's specials, the word-start mark, printable ASCII."""
    return [*T5_SPECIAL, SPACE, *(chr(c) for c in range(ord("!"), ord("~") + 1))]


def _t5_tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import Unigram

    pieces = tiny_t5_pieces()
    # Every piece is one character, so each text has one segmentation; the scores only need to
    # be valid log-probabilities.
    vocab = [(p, 0.0 if p in T5_SPECIAL else -2.0) for p in pieces]
    tok = Tokenizer(Unigram(vocab, unk_id=T5_SPECIAL.index("<unk>"), byte_fallback=False))
    # The pipeline T5's tokenizer.json has and transformers 5 rebuilds around the vocabulary
    # (minus the SentencePiece normalizer, which only sentencepiece can compile).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(
        single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"], special_tokens=[("</s>", 1)]
    )
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in T5_SPECIAL])
    # Re-serialised with fixed formatting: the committed files must not depend on the version's
    # pretty-printer.
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n"


def write_tiny_t5_tokenizer(folder: str | Path) -> Path:
    """Write a character-level T5 tokenizer (tokenizer.json and configs) to ``folder``.

    Loads with ``T5TokenizerFast.from_pretrained(folder)`` offline; byte-identical on every run.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(_t5_tokenizer_json(), encoding="utf-8")
    special = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    config = {
        **special,
        "tokenizer_class": "T5Tokenizer",
        "model_max_length": T5_MAX_LENGTH["dev"],
        # No <extra_id_N> sentinels: they only serve T5's span-corruption pretraining.
        "extra_ids": 0,
        "additional_special_tokens": [],
    }
    for name, data in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def build_tiny_flux_components(variant: Variant = "dev", seed: int = 0) -> dict:
    """transformer, vae, text_encoder (CLIP-L) and text_encoder_2 (T5) with weights drawn under
    ``seed``; each from its own seed offset, so one component does not depend on the others."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    builders = {
        "transformer": lambda: FluxTransformer2DModel(**tiny_transformer_config(variant)),
        "vae": lambda: AutoencoderKL(**tiny_ae_config()),
        "text_encoder": lambda: CLIPTextModel(CLIPTextConfig(**tiny_clip_config())),
        "text_encoder_2": lambda: T5EncoderModel(T5Config(**tiny_t5_config())),
    }
    return build_seeded(builders, seed)


def build_seeded(builders: dict, seed: int) -> dict:
    """name -> the module ``builders[name]()`` builds, in eval mode, seeded with ``seed`` plus
    its position (so one component does not depend on the others) and with its constant
    parameters spread; the caller's random state is left alone."""
    parts = {}
    with torch.random.fork_rng(devices=[]):
        for offset, (name, build) in enumerate(builders.items()):
            torch.manual_seed(seed + offset)
            parts[name] = _spread_constants(build()).eval()
    return parts


def _spread_constants(module: torch.nn.Module) -> torch.nn.Module:
    """Add noise to parameters initialised to one value (norm scales, zero biases).

    Two norms of ones look the same; with distinct values a loader or converter that swaps them
    fails the tests.
    """
    with torch.no_grad():
        for param in module.parameters():
            if param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                param.add_(0.1 * torch.randn(param.shape))
    return module
