"""Captions -> Z-Image's text conditioning, as ``ZImagePipeline._encode_prompt`` makes it.

The facts (diffusers 0.42.1, pipelines/z_image/pipeline_z_image.py), on the shared Qwen3 kind
(library/models/text_encoders/qwen3.py, hidden_states.py):

- Each caption becomes one user turn of Qwen3's chat template with the generation prompt and
  ``enable_thinking=True``, i.e. the text
  ``"<|im_start|>user\\n{caption}<|im_end|>\\n<|im_start|>assistant\\n"`` (no empty think block:
  Qwen3's template writes that only when thinking is off). An empty caption is formatted the
  same way, so its conditioning is the template's tokens alone, never empty.
- The texts are tokenized together, padded to ``max_length`` (512 by default) with
  ``<|endoftext|>`` on the right and truncated to it (a caption that long loses the end of the
  template too).
- Qwen3 runs on the padded ids with the padding mask; the conditioning is the **second-to-last
  hidden state** (``hidden_states[-2]``: the output of the next-to-last decoder layer, before
  the final norm), not the last.
- Each caption keeps only its unpadded positions: the result is a **list** of [L_i, 2560]
  tensors of different lengths L_i, not a padded batch. The transformer takes that list as is
  (it pads each caption to a multiple of 32 with a learned pad token itself); the trainer
  carries them padded to the batch's longest with their lengths (library/models/
  caption_lengths.py) and cuts them back for the transformer.
"""

from __future__ import annotations

from collections.abc import Sequence

from library.models import caption_lengths
from library.models.conditioning import TextConditioning
from library.models.text_encoders import qwen3
from library.models.text_encoders.hidden_states import layer_states

MAX_LENGTH = 512  # the pipeline's default max_sequence_length
HIDDEN_STATE_INDEX = -2  # hidden_states[-2]: the next-to-last decoder layer's output


def encode(tokenizer, encoder, captions: Sequence[str], max_length: int) -> TextConditioning:
    """The captions' states at their own lengths, padded to the batch's longest."""
    ids, mask = qwen3.tokenize(tokenizer, captions, max_length, thinking=True)
    hidden = layer_states(encoder, ids, mask, (HIDDEN_STATE_INDEX,))
    return caption_lengths.text_conditioning(hidden, mask)
