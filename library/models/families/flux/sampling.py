"""Sampling Flux.1 during training: diffusers' FluxPipeline fed our own conditioning.

The facts (diffusers' FluxPipeline, Black Forest Labs' released scheduler configs, kohya's
library/flux_train_utils.sample_image_inference):

- sampler: Euler on the rectified flow, from sigma 1 to 0 over ``linspace(1, 1/N, N)``. dev
  time-shifts the sigmas by mu, which grows linearly with the image's token count from 0.5 at
  256 tokens to 1.15 at 4096 (use_dynamic_shifting); schnell uses them unshifted (shift 1).
  kohya shifts schnell's schedule too; we sample each variant as its released pipeline does.
- guidance: dev takes a distilled guidance value as a transformer input (kohya's prompt option
  ``--g``, key ``guidance_scale``; 3.5 when unset, whatever guidance the run trains with);
  schnell has no guidance input, so the value is not used there (the pipeline and kohya
  ignore it).
- true classifier-free guidance: kohya's ``--l`` (our ``scale``) runs the transformer a second
  time on the negative prompt and mixes ``neg + scale * (pos - neg)``; a scale of 1 (kohya's
  default for Flux) turns it off and the negative prompt is then not used. FluxPipeline only
  runs it for a scale above 1, so scales at or below 1 sample without it.
- size: image sides are rounded down to a multiple of 16 (the AE's 8 times the 2x2 packing),
  as kohya and the pipeline both do.
"""

from __future__ import annotations

from library.errors import ConfigError
from library.models.conditioning import Conditioning
from library.sampling.pipelines import PipelineKind, on_grid, refuse_uncarried

# kohya's distilled guidance of a prompt without --g (not the run's training guidance_scale,
# which kohya recommends setting to 1.0).
SAMPLE_GUIDANCE = 3.5
# The true-CFG scale of a prompt whose scale is unset (None): off, kohya's default for Flux.
SAMPLE_CFG_SCALE = 1.0
SIZE_GRID = 16

# FlowMatchEulerDiscreteScheduler configs of black-forest-labs/FLUX.1-dev and -schnell
# (scheduler/scheduler_config.json).
_SCHEDULER_CONFIGS = {
    "dev": {
        "num_train_timesteps": 1000,
        "shift": 3.0,
        "use_dynamic_shifting": True,
        "base_shift": 0.5,
        "max_shift": 1.15,
        "base_image_seq_len": 256,
        "max_image_seq_len": 4096,
    },
    "schnell": {
        "num_train_timesteps": 1000,
        "shift": 1.0,
        "use_dynamic_shifting": False,
        "base_shift": 0.5,
        "max_shift": 1.15,
        "base_image_seq_len": 256,
        "max_image_seq_len": 4096,
    },
}


def flux_scheduler_config(variant: str) -> dict:
    """The released sampling scheduler config of Flux.1 ``variant`` ("dev" or "schnell")."""
    return dict(_SCHEDULER_CONFIGS[variant])


def flux_pipeline_kind(guidance: bool = True):
    """FluxPipeline, taking Flux.1's conditioning through ``flux_pipeline_inputs``; a prompt's
    unset sampler and CFG scale become Euler and 1 (off), and with ``guidance`` (dev) its
    distilled guidance 3.5."""
    defaults = {"sampler": "euler", "scale": SAMPLE_CFG_SCALE}
    if guidance:
        defaults["guidance_scale"] = SAMPLE_GUIDANCE
    return PipelineKind(
        "FluxPipeline",
        denoiser_argument="transformer",
        call_inputs=flux_pipeline_inputs,
        prompt_defaults=defaults,
    )


def flux_pipeline_inputs(cond: Conditioning, prompt) -> dict:
    """FluxPipeline call keywords from the conditioning of [prompt, negative prompt] and the
    prompt's settings: embeddings, distilled guidance, true CFG and the 16-pixel size."""
    refuse_uncarried(cond, ("pooled_projections", "text_mask"), "FluxPipeline")
    hidden, negative_hidden = cond.encoder_hidden_states.chunk(2)
    pooled, negative_pooled = cond.unet_kwargs["pooled_projections"].chunk(2)
    guidance = prompt.guidance_scale
    scale = prompt.scale if prompt.scale is not None else SAMPLE_CFG_SCALE
    inputs = {
        "prompt_embeds": hidden,
        "pooled_prompt_embeds": pooled,
        "guidance_scale": float(guidance if guidance is not None else SAMPLE_GUIDANCE),
        "width": on_grid(prompt.width, SIZE_GRID),
        "height": on_grid(prompt.height, SIZE_GRID),
    }
    if scale > 1.0:
        inputs |= {
            "negative_prompt_embeds": negative_hidden,
            "negative_pooled_prompt_embeds": negative_pooled,
            "true_cfg_scale": float(scale),
        }
    text_mask = cond.unet_kwargs.get("text_mask")
    if text_mask is not None:
        inputs["joint_attention_kwargs"] = {
            "attention_mask": _attention_mask(text_mask, inputs, scale > 1.0, prompt)
        }
    return inputs


def _attention_mask(text_mask, inputs: dict, true_cfg: bool, prompt):
    """apply_t5_attn_mask while sampling: the prompt's T5 padding masked as keys in every joint
    attention, image tokens always attended to ([1, 1, 1, text + image tokens])."""
    import torch

    if true_cfg:
        # The pipeline runs the negative prompt with the same attention arguments, and its
        # padding differs from the prompt's.
        raise ConfigError(
            f"sample prompt {prompt.index + 1}: true CFG (--l above 1) with apply_t5_attn_mask "
            "is not supported yet; give the prompt --l 1"
        )
    positive = text_mask[:1].bool()
    tokens = (inputs["height"] // SIZE_GRID) * (inputs["width"] // SIZE_GRID)
    image = torch.ones(1, tokens, dtype=torch.bool, device=positive.device)
    return torch.cat([positive, image], dim=1)[:, None, None, :]
