"""Tiny FLUX.1 components and the tiny T5 tokenizer: offline loading, padding, determinism, and one
pass through the whole chain (tokenizers -> text encoders -> transformer; AE both ways)."""

from __future__ import annotations

import pytest
import torch

from library.models.families.flux import shapes
from tests.kits.flux import tiny_shapes
from tests.kits.flux.tiny import (
    SPACE,
    build_tiny_flux_components,
    tiny_t5_pieces,
    write_tiny_t5_tokenizer,
)


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return write_tiny_t5_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer_2")


@pytest.fixture(scope="module")
def t5_tokenizer(t5_dir):
    from transformers import T5TokenizerFast

    return T5TokenizerFast.from_pretrained(t5_dir, local_files_only=True)


def test_tokenizer_files_are_byte_identical(t5_dir, tmp_path):
    again = write_tiny_t5_tokenizer(tmp_path / "again")
    names = sorted(p.name for p in t5_dir.iterdir())
    assert names == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    for name in names:
        assert (again / name).read_bytes() == (t5_dir / name).read_bytes(), name


def test_t5_special_ids(t5_tokenizer):
    assert (t5_tokenizer.pad_token_id, t5_tokenizer.eos_token_id, t5_tokenizer.unk_token_id) == (
        0,
        1,
        2,
    )
    assert t5_tokenizer.pad_token == "<pad>" and t5_tokenizer.eos_token == "</s>"
    assert len(t5_tokenizer) == len(tiny_t5_pieces()) <= tiny_shapes.tiny_t5_config()["vocab_size"]


def test_t5_pads_to_max_length_and_ends_with_eos(t5_dir, t5_tokenizer):
    from tokenizers import Tokenizer

    prompt = "a Cat, 3 dogs"
    batch = t5_tokenizer([prompt], padding="max_length", max_length=24, truncation=True)
    ids, mask = batch["input_ids"][0], batch["attention_mask"][0]
    # Expected by hand: SentencePiece marks each word start with "▁"; every other character is
    # one piece here; then T5's end token, then pad up to max_length.
    pieces = tiny_t5_pieces()
    expected = [pieces.index(p) for word in prompt.split() for p in [SPACE, *word]]
    n = len(expected) + 1
    assert ids == expected + [1] + [0] * (24 - n)
    assert mask == [1] * n + [0] * (24 - n)
    # The tokenizers library reading tokenizer.json on its own agrees (no padding there).
    assert Tokenizer.from_file(str(t5_dir / "tokenizer.json")).encode(prompt).ids == ids[:n]


def test_t5_truncates_keeping_eos_and_maps_unknown(t5_tokenizer):
    ids = t5_tokenizer(["é" + "x" * 40], padding="max_length", max_length=8, truncation=True)
    assert ids["input_ids"][0][:2] == [tiny_t5_pieces().index(SPACE), 2]  # "é" is unknown
    assert len(ids["input_ids"][0]) == 8 and ids["input_ids"][0][-1] == 1


def test_tiny_t5_encoder_runs_on_tokenizer_output(t5_tokenizer):
    encoder = build_tiny_flux_components("schnell")["text_encoder_2"]
    prompt = ["a photo of a cat"]
    with torch.no_grad():
        short = t5_tokenizer(prompt, padding="max_length", max_length=24, return_tensors="pt")
        long = t5_tokenizer(prompt, padding="max_length", max_length=40, return_tensors="pt")
        out_short = encoder(**short).last_hidden_state
        out_long = encoder(**long).last_hidden_state
    assert out_short.shape == (1, 24, tiny_shapes.TINY_T5_WIDTH)
    assert torch.isfinite(out_long).all()
    # With the attention mask, the padding length does not change the prompt's tokens.
    n = int(short["attention_mask"].sum())
    torch.testing.assert_close(out_short[:, :n], out_long[:, :n], rtol=1e-5, atol=1e-5)


def test_components_are_seeded():
    first = build_tiny_flux_components("dev", seed=5)
    second = build_tiny_flux_components("dev", seed=5)
    other = build_tiny_flux_components("dev", seed=6)
    for name, module in first.items():
        state, again = module.state_dict(), second[name].state_dict()
        assert all(torch.equal(state[k], again[k]) for k in state), name
        assert not all(torch.equal(v, other[name].state_dict()[k]) for k, v in state.items()), name


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_tiny_chain(variant, tmp_path, t5_tokenizer):
    """CLIP's pooled output and T5's states fit the transformer; latents pack 2x2 into tokens."""
    from transformers import CLIPTokenizer

    from tests.kits.sd.tiny import write_tiny_tokenizer

    parts = build_tiny_flux_components(variant)
    assert parts["transformer"].config.guidance_embeds == (variant == "dev")
    clip_tok = CLIPTokenizer.from_pretrained(write_tiny_tokenizer(tmp_path / "clip"))
    prompt = ["a cat"]
    clip_ids = clip_tok(prompt, padding="max_length", max_length=77, return_tensors="pt")
    t5_ids = t5_tokenizer(prompt, padding="max_length", max_length=16, return_tensors="pt")
    image = torch.rand(1, 3, tiny_shapes.TINY_SIZE, tiny_shapes.TINY_SIZE) * 2 - 1
    with torch.no_grad():
        pooled = parts["text_encoder"](clip_ids.input_ids).pooler_output
        text = parts["text_encoder_2"](**t5_ids).last_hidden_state
        latents = parts["vae"].encode(image).latent_dist.mean
        assert latents.shape == (1, shapes.LATENT_CHANNELS, 8, 8)
        # Pack 2x2 patches: (1, 16, 8, 8) -> (1, 16 tokens, 64 channels).
        tokens = latents.reshape(1, 16, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 16, 64)
        rows, cols = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(16, 3).float()
        out = parts["transformer"](
            hidden_states=tokens,
            encoder_hidden_states=text,
            pooled_projections=pooled,
            timestep=torch.tensor([0.5]),
            img_ids=img_ids,
            txt_ids=torch.zeros(16, 3),
            guidance=torch.tensor([3.5]) if variant == "dev" else None,
        ).sample
        decoded = parts["vae"].decode(latents).sample
    assert out.shape == tokens.shape
    assert decoded.shape == image.shape
    assert torch.isfinite(out).all() and torch.isfinite(decoded).all()
