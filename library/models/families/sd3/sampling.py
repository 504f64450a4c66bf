"""Sampling SD3/SD3.5 during training: diffusers' StableDiffusion3Pipeline fed our conditioning.

The facts (diffusers' StableDiffusion3Pipeline, the scheduler configs Stability AI released with
SD3 Medium and SD3.5, kohya's library/sd3_train_utils.sample_image_inference):

- sampler: Euler on the rectified flow with the schedule shifted by 3.0
  (library.training.flow_matching.sd3_sampling_sigmas), no resolution-dependent shift;
- guidance: classifier-free, ``neg + scale * (pos - neg)``; a prompt without ``--l`` gets 7.5
  (kohya's SD3 default); a scale of 1 or less samples the prompt alone;
- size: image sides are rounded down to a multiple of 16 (the VAE's 8 times the 2x2 patches).
"""

from __future__ import annotations

from library.models.conditioning import Conditioning
from library.sampling.pipelines import PipelineKind, on_grid, refuse_uncarried

SAMPLE_CFG_SCALE = 7.5
SIZE_GRID = 16

# FlowMatchEulerDiscreteScheduler config of stabilityai/stable-diffusion-3-medium-diffusers and
# the SD3.5 repositories (scheduler/scheduler_config.json).
SCHEDULER_CONFIG = {"num_train_timesteps": 1000, "shift": 3.0}


def sd3_scheduler_config() -> dict:
    """The released sampling scheduler config of SD3 and SD3.5."""
    return dict(SCHEDULER_CONFIG)


def sd3_pipeline_kind():
    """StableDiffusion3Pipeline taking SD3's conditioning through ``sd3_pipeline_inputs``; a
    prompt's unset sampler and CFG scale become Euler and 7.5."""
    return PipelineKind(
        "StableDiffusion3Pipeline",
        denoiser_argument="transformer",
        call_inputs=sd3_pipeline_inputs,
        prompt_defaults={"sampler": "euler", "scale": SAMPLE_CFG_SCALE},
    )


def sd3_pipeline_inputs(cond: Conditioning, prompt) -> dict:
    """StableDiffusion3Pipeline call keywords from the conditioning of [prompt, negative
    prompt]: embeddings, the CFG scale and the 16-pixel size."""
    refuse_uncarried(cond, ("pooled_projections",), "StableDiffusion3Pipeline")
    hidden, negative_hidden = cond.encoder_hidden_states.chunk(2)
    pooled, negative_pooled = cond.unet_kwargs["pooled_projections"].chunk(2)
    return {
        "prompt_embeds": hidden,
        "negative_prompt_embeds": negative_hidden,
        "pooled_prompt_embeds": pooled,
        "negative_pooled_prompt_embeds": negative_pooled,
        "guidance_scale": float(prompt.scale if prompt.scale is not None else SAMPLE_CFG_SCALE),
        "width": on_grid(prompt.width, SIZE_GRID),
        "height": on_grid(prompt.height, SIZE_GRID),
    }
