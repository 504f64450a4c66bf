"""The diffusers pipeline that samples a model family, assembled from the live modules.

Which pipeline a family gets is the family's to say (ModelFamily.sampling_pipeline); the rest
of sampling never asks which family it has. The prompts are encoded by our own
``encode_conditioning``, exactly as captions are in training (layer choice, pooled embedding,
size numbers), and handed to the pipeline as embeddings, with the guidance settings the family's
``PipelineKind.call_inputs`` reads from the prompt; the pipeline only runs the denoising loop and
the VAE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from library.models.conditioning import Conditioning
from library.sampling.experts import expert_arguments
from library.sampling.samplers import DEFAULT_SAMPLER

# The classifier-free guidance scale of a prompt that gives none (SD's usual 7.5).
DEFAULT_CFG_SCALE = 7.5


def guided_inputs(cond: Conditioning, prompt) -> dict:
    """SD's and SDXL's call keywords for one (completed) prompt: the embeddings
    (``pipeline_inputs``) and the prompt's classifier-free guidance scale."""
    return pipeline_inputs(cond) | {"guidance_scale": prompt.scale}


@dataclass(frozen=True)
class PipelineKind:
    """A diffusers pipeline class, the constructor keywords it needs besides the modules, and
    how a prompt becomes its call keywords.

    ``call_inputs(cond, prompt)`` gets the conditioning of [prompt, negative prompt] and the
    SamplePrompt; it returns the text and guidance keywords of the call, and may return
    ``width``/``height`` to replace the prompt's size (e.g. rounded to the model's grid).
    ``first_frame_argument``: the call keyword an image-to-video pipeline takes its first frame
    in ("image"); None where the pipeline starts from noise alone.
    """

    class_name: str
    options: dict = field(default_factory=dict)
    denoiser_argument: str = "unet"  # the constructor argument that takes the denoiser
    call_inputs: Callable[[Conditioning, object], dict] = guided_inputs
    first_frame_argument: str | None = None
    # A model with experts (library.models.experts): the constructor arguments of its
    # high-noise and low-noise experts and of the boundary between them (sampling/experts.py).
    expert_arguments: tuple[str, str, str] | None = None
    # SamplePrompt fields a prompt left unset (None) -> the model's default for them.
    prompt_defaults: dict = field(
        default_factory=lambda: {"scale": DEFAULT_CFG_SCALE, "sampler": DEFAULT_SAMPLER}
    )

    def complete(self, prompt):
        """``prompt`` with the fields it left unset filled with this model's defaults."""
        unset = {k: v for k, v in self.prompt_defaults.items() if getattr(prompt, k) is None}
        return dataclasses.replace(prompt, **unset) if unset else prompt


def on_grid(pixels: int, grid: int) -> int:
    """An image side rounded down to a multiple of ``grid`` (at least 4 of them), as the
    transformer pipelines round sizes."""
    return max(4 * grid, pixels - pixels % grid)


def refuse_uncarried(cond: Conditioning, carried, pipeline: str) -> None:
    """ValueError for a conditioning input other than ``carried`` (names of unet_kwargs the
    ``pipeline``'s call inputs pass on): the pipeline would silently drop it."""
    extra = sorted(set(cond.unet_kwargs) - set(carried))
    if extra:
        raise ValueError(f"no {pipeline} argument carries the conditioning input {extra[0]!r}")


def pipeline_kind(family) -> PipelineKind:
    """The pipeline for ``family`` (its sampling_pipeline); ConfigError (sample_prompts) when
    no pipeline fits it."""
    return family.sampling_pipeline()


def build_pipeline(
    components,
    denoiser: torch.nn.Module,
    text_encoders: Sequence[torch.nn.Module],
    scheduler,
    boundary: float | None = None,
):
    """The family's pipeline holding these module objects (no copies); a model's experts split
    at ``boundary`` when given (the run's timestep_boundary), else at the model's own.

    ``text_encoders`` are in ``family.text_encoder_subfolders`` order; each goes in under its
    subfolder's name ("text_encoder", "text_encoder_2"), which is also the pipeline's argument
    name, and so do the tokenizers; a model's image encoder (Components.image_encoder) goes in
    as image_encoder and image_processor.
    """
    import diffusers

    family = components.family
    kind = pipeline_kind(family)
    encoders = dict(zip(family.text_encoder_subfolders, text_encoders, strict=True))
    tokenizers = dict(zip(family.tokenizer_subfolders, components.tokenizers, strict=True))
    cls = getattr(diffusers, kind.class_name)
    denoisers = {kind.denoiser_argument: denoiser} | expert_arguments(components, kind, boundary)
    image = getattr(components, "image_encoder", None)  # stand-ins in tests may have none
    images = {} if image is None else {"image_encoder": image.model,
                                       "image_processor": image.processor}  # fmt: skip
    pipe = cls(
        vae=components.vae,
        **denoisers,
        scheduler=scheduler,
        **encoders,
        **tokenizers,
        **images,
        **kind.options,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_inputs(cond: Conditioning) -> dict:
    """Keyword arguments of a pipeline call from the conditioning of [prompt, negative prompt].

    The cross-attention states become prompt_embeds / negative_prompt_embeds; SDXL's pooled
    embedding becomes (negative_)pooled_prompt_embeds, and its six size numbers (original h, w,
    crop top, left, target h, w) the size arguments the pipeline turns back into the same ids.
    """
    embeds, negative = cond.encoder_hidden_states.chunk(2)
    inputs = {"prompt_embeds": embeds, "negative_prompt_embeds": negative}
    added = dict(cond.unet_kwargs.get("added_cond_kwargs", {}))
    pooled = added.pop("text_embeds", None)
    if pooled is not None:
        pooled, negative_pooled = pooled.chunk(2)
        inputs |= {"pooled_prompt_embeds": pooled, "negative_pooled_prompt_embeds": negative_pooled}
    time_ids = added.pop("time_ids", None)
    if time_ids is not None:
        for prefix, row in (("", 0), ("negative_", 1)):
            ids = [int(round(v)) for v in time_ids[row].tolist()]
            inputs[f"{prefix}original_size"] = (ids[0], ids[1])
            inputs[f"{prefix}crops_coords_top_left"] = (ids[2], ids[3])
            inputs[f"{prefix}target_size"] = (ids[4], ids[5])
    if added or set(cond.unet_kwargs) - {"added_cond_kwargs"}:
        # A conditioning input no pipeline argument carries would be silently dropped.
        unknown = sorted(added) or sorted(set(cond.unet_kwargs) - {"added_cond_kwargs"})
        raise ValueError(f"no pipeline argument carries the conditioning input {unknown[0]!r}")
    return inputs
