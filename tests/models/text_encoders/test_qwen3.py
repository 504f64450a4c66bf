"""The shared Qwen3 text-encoder steps against diffusers' own Qwen3 prompt encoding."""

from __future__ import annotations

import pytest
import torch

from library.models.text_encoders import hidden_states, qwen3
from tools.make_test_assets import ASSETS_DIR

CAPTIONS = ["a red cube on a table", ""]


@pytest.fixture(scope="module")
def parts():
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(ASSETS_DIR / "qwen3_tokenizer"))
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    return tokenizer, Qwen3ForCausalLM(config).eval()


def test_layer_states_are_flux2_kleins_prompt_embeds(parts):
    """Flux2KleinPipeline's own encoding (thinking off, padded, layers stacked per token)."""
    from diffusers import Flux2KleinPipeline

    tokenizer, encoder = parts
    ids, mask = qwen3.tokenize(tokenizer, CAPTIONS, 32, thinking=False)
    with torch.no_grad():
        ours = hidden_states.layer_states(encoder, ids, mask, (1, 2, 3))
        want = Flux2KleinPipeline._get_qwen3_prompt_embeds(
            encoder, tokenizer, CAPTIONS, max_sequence_length=32, hidden_states_layers=(1, 2, 3)
        )
    assert ours.shape == (2, 32, 48)
    assert torch.equal(ours, want)
    # another choice of layers is another conditioning
    with torch.no_grad():
        assert not torch.equal(hidden_states.layer_states(encoder, ids, mask, (0, 2, 3)), want)


def test_thinking_is_the_templates_switch(parts):
    tokenizer, _ = parts
    off = qwen3.chat_text(tokenizer, "cat", thinking=False)
    on = qwen3.chat_text(tokenizer, "cat", thinking=True)
    assert off == on + "<think>\n\n</think>\n\n"
    ids, mask = qwen3.tokenize(tokenizer, ["cat"], 40, thinking=True)
    assert ids.shape == mask.shape == (1, 40) and mask.dtype == torch.bool
    assert ids[0, : int(mask.sum())].tolist() == tokenizer(on).input_ids


def test_meta_encoder_gives_the_shape_only(parts):
    tokenizer, encoder = parts
    meta = encoder.to("meta")
    ids, mask = qwen3.tokenize(tokenizer, CAPTIONS, 8, thinking=False)
    states = hidden_states.layer_states(meta, ids, mask, (1, 2))
    assert states.device.type == "meta" and states.shape == (2, 8, 32)
