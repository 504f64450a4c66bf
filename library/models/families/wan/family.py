"""Wan as a ModelFamily (facts: spec.py, diffusers' WanPipeline): latents are the Wan VAE's clips
normalised per channel, [B, 16, F', h, w] (an image: one latent frame); captions are umT5's
states at 512 tokens, zero past each caption's own (text_encoders/umt5.py), kept per caption at
its own length in the text cache and padded back with zeros; the transformer takes the noisy
latents whole (its own 1x2x2 patches and 3-D rotary positions) at timestep 1000 sigma and
returns the velocity noise - x0; only the transformer trains (as musubi-tuner). LoRA modules
are kohya's ten Linears of every block, written as musubi-tuner names them (``lora_unet_`` +
the original path, with alpha): the layout diffusers' WanPipeline.load_lora_weights converts
and ComfyUI's Wan key map reads. A full fine-tune is the transformer in the original names.

Samples through diffusers' WanPipeline fed our conditioning, on the folder's scheduler
(UniPCMultistepScheduler over flow sigmas; single files: the released one); its guidance is
the usual CFG at the prompt's scale (musubi-tuner's --l; unset: the pipeline's 5), with the
negative prompt's states when the scale is above 1. Sides are rounded down to multiples of 16."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.models.components import Components
from library.models.conditioning import Conditioning, TextConditioning
from library.models.experts import LOW_NOISE
from library.models.families.base import (
    FIRST_FRAME_IMAGE_STATES_KEY,
    FIRST_FRAME_LATENTS_KEY,
    derived_family,
)
from library.models.families.spec_loader import load_main_file, load_spec, write_main_file
from library.models.families.transformer_family import (
    TrainerDraw,
    TransformerFamily,
    swappable_tails,
)
from library.models.families.wan import spec
from library.models.families.wan.experts import (
    file_experts,
    folder_experts,
    refuse_folder_expert_file,
)
from library.models.families.wan.keys import TABLE, TABLE_CLIP
from library.models.image_encoders.clip_vision import (
    ImageEncoder,
    clip_processor,
    folder_processor,
)
from library.models.model_files import read_json
from library.models.text_encoders.umt5 import MAX_TOKENS, umt5_states
from library.models.video_latent_codec import ChannelNormalizedVideoCodec
from library.networks.kohya_names import unwrap
from library.networks.table_modules import table_modules
from library.sampling.pipelines import PipelineKind, on_grid
from library.training import flow_matching as fm
from library.training.objectives import VelocityObjective, shift_draw

DEFAULT_SCALE = 5.0  # the pipeline's guidance_scale
DRAW = TrainerDraw(shift_draw(spec.DISCRETE_FLOW_SHIFT))  # musubi-tuner's Wan guide (shift 3)


class WanFlowObjective(VelocityObjective):
    """Rectified flow at timestep 1000 sigma (the pipelines' scheduler timesteps); min_timestep
    / max_timestep (musubi-tuner's, out of 1000) narrow the drawn sigma into their range
    linearly, or with preserve_distribution_shape keep the draw whole for the step to draw
    again until it lies inside (library.training.level_redraw). Samples on the model's UniPC
    scheduler."""

    LABEL = "Wan"
    TIMESTEP_RANGE = True
    RANGE_REDRAW = True

    def levels(self, draws, latent_shape):
        sigmas = super().levels(draws, latent_shape)
        if self.preserve_shape:
            return sigmas
        low, high = self.range_fractions()
        return sigmas * (high - low) + low

    def model_time(self, t):
        return t * fm.NUM_TRAIN_TIMESTEPS

    def sampler(self, name: str):
        from diffusers import UniPCMultistepScheduler

        return UniPCMultistepScheduler.from_config(self.sampling_scheduler)


def wan_pipeline_inputs(cond: Conditioning, prompt, grid: int = spec.PIXEL_MULTIPLE) -> dict:
    """Call keywords from the conditioning of [prompt, negative prompt] (the frame count is the
    prompt's, added by the shared sampling); sides rounded down to multiples of ``grid``."""
    embeds, negative = cond.encoder_hidden_states.chunk(2)
    inputs = {
        "prompt_embeds": embeds, "guidance_scale": float(prompt.scale),
        "width": on_grid(prompt.width, grid), "height": on_grid(prompt.height, grid),
    }  # fmt: skip
    return inputs | ({"negative_prompt_embeds": negative} if prompt.scale > 1 else {})


def block_modules(transformer, table=TABLE) -> list:
    """kohya's modules: the ten Linears of every block (keys.py; TABLE_CLIP: twelve, the image
    keys and values after the cross-attention's four), in musubi-tuner's order."""
    return table_modules(transformer, "lora_unet", table, (("blocks", "blocks"),))


@dataclass(frozen=True, kw_only=True)
class WanFamily(TransformerFamily):
    """Wan 2.1 / Wan 2.2 A14B (its two experts: experts.py) with umT5 captions."""

    FLOW_KIND: ClassVar[str] = "wan"
    LABEL: ClassVar[str] = "Wan"
    TRAINS_CLIPS: ClassVar[bool] = True
    FRAME_RATE: ClassVar[float] = 16.0  # Wan 2.1's and the A14B's clips (musubi-tuner's target)
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = "umT5 gets no adapters, as in musubi-tuner"
    LYCORIS_EMPTY_PRESETS: ClassVar[tuple[str, ...]] = ("unet-convblock-only",)
    NAMES: ClassVar[object] = TABLE  # the transformer's original names (keys.py)

    def describe(self) -> str:
        return f"Wan ({MAX_TOKENS} umT5 tokens, zero past each caption)"

    @property
    def text_cache_name(self) -> str:
        return f"{self.name}|umt5_tokens={MAX_TOKENS}|zeroed"

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ) -> TextConditioning:
        (tokenizer,), (encoder,) = tokenizers, text_encoders
        states, mask = umt5_states(tokenizer, encoder, captions, device)
        # the dry run's estimate runs on the meta device: every row whole there
        lengths = None if mask.is_meta else mask.sum(dim=1).cpu()
        return TextConditioning(states, None, None, lengths)

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        """The states padded with zeros to the pipelines' 512 tokens (a cache batch holds them
        cut to their longest caption)."""
        hidden = text.hidden.to(device, dtype or text.hidden.dtype)
        missing = MAX_TOKENS - hidden.shape[1]
        if missing > 0:
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, missing))
        return Conditioning(hidden, {})

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        """The velocity [B, C, F', h, w] at timesteps 1000 sigma (with the first frame's CLIP
        states where the conditioning has them: Wan 2.1 I2V-14B)."""
        states = cond.unet_kwargs.get("image_states")
        images = {} if states is None else {"encoder_hidden_states_image": states}
        return denoiser(
            hidden_states=noisy, timestep=timesteps,
            encoder_hidden_states=cond.encoder_hidden_states, return_dict=False, **images,
        )[0]  # fmt: skip

    def latent_codec(self, vae):
        return ChannelNormalizedVideoCodec(vae)

    def trains_text_encoder(self, index: int) -> bool:
        return False  # DENOISER_ONLY_ADAPTERS

    def transformer_modules(self, transformer):
        return block_modules(transformer, self.NAMES)

    def file_modules(self, transformer):
        return block_modules(transformer, self.NAMES)

    def lycoris_modules(self, transformer, preset):
        """The Linears of every block; attn-only: the attention ones."""
        modules = block_modules(transformer, self.NAMES)
        if preset == "attn-only":
            return [m for m in modules if "_attn." in m.original]
        return modules

    def swap_blocks(self, transformer, count):
        return swappable_tails(("", transformer.blocks, count), count=count)

    def sampling_pipeline(self):
        return PipelineKind(
            "WanPipeline", denoiser_argument="transformer", call_inputs=wan_pipeline_inputs,
            prompt_defaults={"scale": DEFAULT_SCALE, "sampler": "euler"},
            expert_arguments=("transformer", "transformer_2", "boundary_ratio"),
        )  # fmt: skip

    def metadata_keys(self, config):
        """musubi-tuner's Wan trainer's draw, in kohya's ss_* names."""
        return {"ss_model_type": "wan", **DRAW.metadata(config.flow)}

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """The transformer alone in the original names (as Wan-AI's and ComfyUI's files), its
        config in the header for exact reloading."""
        write_main_file(spec.SPEC, path, denoiser, metadata, dtype)

    def full_model_modules(self, components):
        return (components.denoiser,)


WAN = WanFamily(
    name="wan", prediction_type="flow", base_model_version="wan2.1",
    modelspec_architecture="wan2.1-t2v", default_resolution=832,
    text_encoder_lora_prefixes=("lora_te",),
    lora_implementation="https://github.com/kohya-ss/musubi-tuner",
    checkpoint_implementation="https://github.com/Wan-Video/Wan2.1",
    denoiser_subfolder="transformer",
    network_modules=("lycoris.kohya", "networks.lora", "networks.lora_wan"),
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class WanTi2vFamily(WanFamily):
    """Wan 2.2 TI2V-5B trained as text to video: the Wan 2.2 VAE's 48 channels at 16 times
    smaller sides (samples' sides: multiples of 32), 24 fps clips, and a timestep per latent
    token (diffusers' expand_timesteps), each token the sample's own time as WanPipeline gives
    it without a first frame."""

    FRAME_RATE: ClassVar[float] = 24.0  # TI2V-5B's clips (musubi-tuner's target)
    PIXEL_MULTIPLE: ClassVar[int] = 32  # the VAE's 16 times the 2x2 patches

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        frames, height, width = noisy.shape[2:]
        _, ph, pw = unwrap(denoiser).config.patch_size  # DDP's wrapper has no config
        tokens = frames * (height // ph) * (width // pw)  # the patch embedding's count
        per_token = timesteps.view(-1, 1).expand(-1, tokens)
        return super().predict(denoiser, noisy, per_token, cond)

    def sampling_pipeline(self):
        return replace(
            super().sampling_pipeline(), options={"expand_timesteps": True},
            call_inputs=functools.partial(wan_pipeline_inputs, grid=self.PIXEL_MULTIPLE),
        )  # fmt: skip


WAN_TI2V = derived_family(
    WAN, WanTi2vFamily, base_model_version="wan2.2", modelspec_architecture="wan2.2-ti2v-5b",
    default_resolution=1280,
)  # fmt: skip


def first_frame_condition(latents: torch.Tensor) -> torch.Tensor:
    """The condition an image-to-video transformer reads after the noisy latents, from the
    first frame's latents [B, C, F', h, w]: the mask of the frames the image gives (the first
    latent frame's four, none after) then those latents, [B, 4 + C, F', h, w], as
    WanImageToVideoPipeline.prepare_latents builds it."""
    batch, _, frames, height, width = latents.shape
    mask = latents.new_zeros(batch, spec.TEMPORAL, frames, height, width)
    mask[:, :, 0] = 1
    return torch.cat([mask, latents], dim=1)


@dataclass(frozen=True, kw_only=True)
class WanI2vFamily(WanFamily):
    """Wan 2.2 I2V-A14B: its two experts read the noisy latents followed by the sample's first
    frame as the condition (first_frame_condition over FIRST_FRAME_LATENTS_KEY: its latents
    cached with the clip's, library.data.samples), 36 channels in, the velocity's 16 out;
    samples through WanImageToVideoPipeline from the prompt's first frame."""

    FIRST_FRAME_CONDITION: ClassVar[bool] = True

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        """The caption's states and, in training and validation, the first frame's condition
        (samples: the pipeline builds it from the prompt's image)."""
        cond = super().assemble_conditioning(text, batch, device, dtype)
        latents = (batch or {}).get(FIRST_FRAME_LATENTS_KEY)
        if latents is None:
            return cond
        latents = latents.to(device, dtype or cond.encoder_hidden_states.dtype)
        return Conditioning(cond.encoder_hidden_states, {"condition": first_frame_condition(latents)})

    def predict(self, denoiser, noisy, timesteps, cond) -> torch.Tensor:
        condition = cond.unet_kwargs["condition"].to(noisy.dtype)
        return super().predict(denoiser, torch.cat([noisy, condition], dim=1), timesteps, cond)

    def sampling_pipeline(self):
        """WanImageToVideoPipeline with both experts and no image encoder, its first frame the
        prompt's image (--i)."""
        return replace(
            super().sampling_pipeline(), class_name=spec.I2V_PIPELINE, first_frame_argument="image",
            options={"image_encoder": None, "image_processor": None},
        )  # fmt: skip


WAN_I2V = derived_family(
    WAN, WanI2vFamily, base_model_version="wan2.2", modelspec_architecture="wan2.2-i2v-a14b",
    checkpoint_implementation="https://github.com/Wan-Video/Wan2.2",
)


@dataclass(frozen=True, kw_only=True)
class WanI2vClipFamily(WanI2vFamily):
    """Wan 2.1 I2V-14B: one transformer reading the first frame's condition (as I2V-A14B) and,
    beside the caption's states, the CLIP vision tower's states of that frame
    (FIRST_FRAME_IMAGE_STATES_KEY, as the pipeline's encode_image: Components.image_encoder);
    samples through WanImageToVideoPipeline with that encoder and its processor."""

    NAMES: ClassVar[object] = TABLE_CLIP  # the image input's Linears too (twelve per block)

    def assemble_conditioning(self, text, batch, device, dtype=None) -> Conditioning:
        cond = super().assemble_conditioning(text, batch, device, dtype)
        states = (batch or {}).get(FIRST_FRAME_IMAGE_STATES_KEY)
        if states is None:
            return cond
        states = states.to(device, dtype or cond.encoder_hidden_states.dtype)
        return Conditioning(cond.encoder_hidden_states, {**cond.unet_kwargs, "image_states": states})

    def sampling_pipeline(self):
        """WanImageToVideoPipeline with the one transformer and the image encoder (the shared
        build passes it), its first frame the prompt's image (--i)."""
        return replace(super().sampling_pipeline(), options={})

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        write_main_file(spec.SPEC_I2V_CLIP, path, denoiser, metadata, dtype)


WAN_I2V_CLIP = derived_family(
    WAN, WanI2vClipFamily, base_model_version="wan2.1", modelspec_architecture="wan2.1-i2v-14b",
)


def family_class(model: ModelSection, flow: FlowSection) -> type[WanFamily]:
    """WanTi2vFamily for TI2V-5B ([flow] task ti2v-5B, a folder whose model_index.json sets
    expand_timesteps, or a transformer file on 48 channels), WanI2vFamily for I2V-A14B (task
    i2v-A14B, or a WanImageToVideoPipeline folder; a file's is known once read),
    WanI2vClipFamily for I2V-14B (task i2v-14B, such a folder with an image encoder, or a
    transformer file reading image states), else WanFamily: the class data read before any
    weight is."""
    task = getattr(flow, "task", None)
    tasks = {"ti2v-5B": WanTi2vFamily, "i2v-A14B": WanI2vFamily, "i2v-14B": WanI2vClipFamily}
    if task in tasks:
        return tasks[task]
    if spec.model_spec(model) is spec.SPEC_I2V_CLIP:
        return WanI2vClipFamily
    main = Path(model.pretrained_model_name_or_path).expanduser()
    if main.is_file():
        return WanTi2vFamily if spec.is_ti2v_file(main) else WanFamily
    index = read_json(main / "model_index.json") if (main / "model_index.json").is_file() else {}
    if index.get("expand_timesteps"):
        return WanTi2vFamily
    return WanI2vFamily if index.get("_class_name") == spec.I2V_PIPELINE else WanFamily


def load_wan(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Wan's Components (frozen, on the CPU); ModelError for any problem with the files."""
    main = Path(model.pretrained_model_name_or_path).expanduser()
    refuse_folder_expert_file(main, getattr(flow, "dit_high_noise", None))
    loaded = load_spec(spec.model_spec(model), model, flow, weight_dtype, vae_dtype)
    transformer, vae, text_encoder = (loaded.modules[k] for k in ("transformer", "vae", "text_encoder"))
    objective = WanFlowObjective(DRAW.options(flow), loaded.facts.scheduler, patch=2)
    if main.is_dir():
        experts = folder_experts(main, transformer, weight_dtype)
    else:
        experts = file_experts(getattr(flow, "dit_high_noise", None), transformer,
                               lambda path: load_main_file(spec.SPEC, path, weight_dtype),
                               loaded.facts.first_frame)  # fmt: skip
    return Components(
        denoiser=transformer if experts is None else experts.modules[LOW_NOISE], vae=vae,
        text_encoders=(text_encoder,), tokenizers=tuple(loaded.tokenizers.values()),
        objective=objective, family=replace(_family_of(loaded.facts)),
        model_dir=loaded.model_dir, experts=experts, image_encoder=_image_encoder(loaded),
    )  # fmt: skip


def _image_encoder(loaded) -> ImageEncoder | None:
    """Wan 2.1 I2V-14B's CLIP vision tower with the folder's image processor (single files:
    CLIP ViT-H's)."""
    model = loaded.modules.get(spec.IMAGE_ENCODER)
    if model is None:
        return None
    folder = loaded.model_dir / spec.IMAGE_PROCESSOR
    return ImageEncoder(model, folder_processor(folder) if folder.is_dir() else clip_processor())


def _family_of(facts: spec.Facts) -> WanFamily:
    if facts.expand_timesteps:
        return WAN_TI2V
    if facts.image_states:
        return WAN_I2V_CLIP
    return WAN_I2V if facts.first_frame else WAN
