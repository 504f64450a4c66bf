"""The shared Mistral 3 text-encoder steps against Flux2Pipeline's own prompt encoding."""

from __future__ import annotations

import pytest
import torch

from library.models.text_encoders import hidden_states, mistral3
from tools.make_test_assets import ASSETS_DIR

CAPTIONS = ["a red cube on a table [IMG]", ""]
# A chat template of Mistral's shape (system prompt, then instructions) over list contents.
TEMPLATE = (
    "{%- for message in messages -%}{%- if message['role'] == 'system' -%}[SYSTEM_PROMPT]"
    "{{ message['content'][0]['text'] }}[/SYSTEM_PROMPT]{%- else -%}[INST]"
    "{%- for part in message['content'] -%}{{ part['text'] }}{%- endfor -%}[/INST]"
    "{%- endif -%}{%- endfor -%}"
)


@pytest.fixture(scope="module")
def parts():
    from transformers import (
        AutoTokenizer,
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralVisionConfig,
    )

    tokenizer = AutoTokenizer.from_pretrained(str(ASSETS_DIR / "qwen3_tokenizer"))
    tokenizer.chat_template = TEMPLATE
    text = MistralConfig(vocab_size=len(tokenizer), hidden_size=8, intermediate_size=16,
                         num_hidden_layers=31, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=4)  # fmt: skip
    vision = PixtralVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, head_dim=4, image_size=32, patch_size=16)  # fmt: skip
    config = Mistral3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                            spatial_merge_size=1)  # fmt: skip
    torch.manual_seed(0)
    return tokenizer, Mistral3ForConditionalGeneration(config).eval()


def test_layer_states_are_flux2_devs_prompt_embeds(parts):
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    tokenizer, encoder = parts
    ids, mask = mistral3.tokenize(tokenizer, CAPTIONS, 300, SYSTEM_MESSAGE)
    with torch.no_grad():
        ours = hidden_states.layer_states(encoder, ids, mask, (10, 20, 30))
        want = Flux2Pipeline._get_mistral_3_small_prompt_embeds(
            encoder, tokenizer, CAPTIONS, max_sequence_length=300
        )
    assert ours.shape == (2, 300, 24)
    assert torch.equal(ours, want)
    with torch.no_grad():  # the system message is part of the conditioning
        other = mistral3.tokenize(tokenizer, CAPTIONS, 300, system="")
        assert not torch.equal(hidden_states.layer_states(encoder, *other, (10, 20, 30)), want)
