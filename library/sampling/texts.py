"""Sample prompts' text states computed ahead of the rounds, for runs whose text encoders
cannot be called while sampling (fsdp_text_encoder: their sharded copies are freed after the
text cache fill, library/training/text_sharding.py).

The prompts are read once, when the run starts (SampleRunner), so the states computed then are
those of every round. Each prompt's texts are encoded as ``generate._generate`` encodes them: the
prompt and its negative prompt as one batch of two, under the same autocast; only the text part
(TextConditioning) is kept, in host memory, and a round assembles the conditioning from it with
the prompt's size and reference entries as it would from freshly encoded texts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from library.models.conditioning import encode_text
from library.models.conditioning_data import TextConditioning

# A prompt's texts: (prompt, negative prompt), the batch one image is conditioned on.
TextsKey = tuple[str, str]
SampleTexts = Mapping[TextsKey, TextConditioning]


def prompt_texts(prompt) -> TextsKey:
    """The texts ``prompt`` (a SamplePrompt) is conditioned on, in the order they are encoded."""
    return (prompt.prompt, prompt.negative_prompt)


def encode_sample_texts(prompts: Sequence, encode: Callable[[list[str]], TextConditioning]) -> dict:
    """Each distinct prompt's texts (prompt_texts) -> ``encode``'s output for them, moved to host
    memory. Every prompt's texts are encoded in prompt order, so processes calling sharded
    encoders with the same prompts make the same calls (each call is a collective)."""
    states: dict[TextsKey, TextConditioning] = {}
    for prompt in prompts:
        key = prompt_texts(prompt)
        if key not in states:
            states[key] = moved(encode(list(key)), "cpu")
    return states


def text_encoder(components, encoders: Sequence[torch.nn.Module], device, accelerator=None,
                 clip_skip: int | None = None, max_token_length: int | None = None):  # fmt: skip
    """``encode(texts)`` for encode_sample_texts: ``components``' family text path through
    ``encoders`` (its own or their sharded copies), under the accelerator's autocast as a round
    encodes, keeping no graph."""

    def encode(texts: list[str]) -> TextConditioning:
        autocast = accelerator.autocast() if accelerator is not None else contextlib.nullcontext()
        with torch.no_grad(), autocast:
            return encode_text(components.family, components.tokenizers, encoders, texts,
                               device, clip_skip, max_token_length)  # fmt: skip

    return encode


def texts_for(states: SampleTexts, prompt, device) -> TextConditioning:
    """``prompt``'s precomputed text states on ``device``; RuntimeError where they were not
    computed (the encoders that could compute them are gone)."""
    key = prompt_texts(prompt)
    if key not in states:
        raise RuntimeError(
            f"sample prompt {prompt.index + 1}'s texts were not encoded while the text "
            "encoders could encode them (before training)"
        )
    return moved(states[key], device)


def moved(text: TextConditioning, device) -> TextConditioning:
    """``text`` with each of its tensors on ``device`` (values and dtypes unchanged)."""
    changes = {
        f.name: value.to(device)
        for f in dataclasses.fields(text)
        if isinstance(value := getattr(text, f.name), torch.Tensor)
    }
    return dataclasses.replace(text, **changes)
