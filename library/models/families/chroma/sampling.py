"""Sampling Chroma during training: diffusers' ChromaPipeline fed our own conditioning.

The facts (diffusers 0.42.1 ChromaPipeline.__call__):

- sampler: Euler on the rectified flow over ``linspace(1, 1/N, N)``, shifted by the scheduler's
  mu for the image's token count (the folder's scheduler config; Chroma's is FLUX.1 dev's);
- classifier-free guidance: the pipeline runs the negative prompt as a second transformer call
  and mixes ``neg + scale * (pos - neg)`` for a scale above 1 (its default is 5.0; at or below
  1 it samples without the negative prompt); there is no distilled guidance input;
- text: the prompt's T5 states and attention mask are passed as ``prompt_embeds`` and
  ``prompt_attention_mask`` (and the negative's likewise); the masks are boolean, so the
  pipeline masks the padding (its own float masks would add to the attention scores instead:
  conditioning.py);
- size: image sides rounded down to a multiple of 16.
"""

from __future__ import annotations

from library.models.conditioning import Conditioning
from library.models.families.chroma.conditioning import TEXT_MASK, transformer_text_mask
from library.sampling.pipelines import PipelineKind, on_grid, refuse_uncarried

# ChromaPipeline's default guidance scale, the CFG scale of a prompt that gives none.
SAMPLE_CFG_SCALE = 5.0
SIZE_GRID = 16


def chroma_pipeline_kind() -> PipelineKind:
    """ChromaPipeline taking Chroma's conditioning through ``chroma_pipeline_inputs``; a
    prompt's unset sampler and CFG scale become Euler and the pipeline's 5.0."""
    return PipelineKind(
        "ChromaPipeline",
        denoiser_argument="transformer",
        call_inputs=chroma_pipeline_inputs,
        prompt_defaults={"sampler": "euler", "scale": SAMPLE_CFG_SCALE},
    )


def chroma_pipeline_inputs(cond: Conditioning, prompt) -> dict:
    """ChromaPipeline call keywords from the conditioning of [prompt, negative prompt]:
    embeddings and boolean attention masks, the CFG scale and the 16-pixel size."""
    refuse_uncarried(cond, (TEXT_MASK,), "ChromaPipeline")
    hidden, negative_hidden = cond.encoder_hidden_states.chunk(2)
    mask, negative_mask = transformer_text_mask(cond.unet_kwargs[TEXT_MASK]).chunk(2)
    scale = prompt.scale if prompt.scale is not None else SAMPLE_CFG_SCALE
    inputs = {
        "prompt_embeds": hidden,
        "prompt_attention_mask": mask,
        "guidance_scale": float(scale),
        "width": on_grid(prompt.width, SIZE_GRID),
        "height": on_grid(prompt.height, SIZE_GRID),
    }
    if scale > 1.0:
        inputs |= {
            "negative_prompt_embeds": negative_hidden,
            "negative_prompt_attention_mask": negative_mask,
        }
    return inputs
