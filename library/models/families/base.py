"""What every model family provides: the seam a new family (Flux, SD3, ...) implements.

A family is data (metadata strings, text-encoder slots, LoRA prefixes, latent format, which
conditioning it takes) plus the few behaviours that differ between architectures: how its
denoiser is called, how captions become its conditioning, which layers a default adapter
adapts, how its full weights are written, which pipeline samples it and how its files are
loaded. The trainer, the savers and the sampler read these and never branch on a family's name.
Instances are frozen; variants of one architecture (SD 2.x 512 / 768-v) are separate instances.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch

from library.errors import ConfigError
from library.models.conditioning_data import Conditioning, TextConditioning
from library.models.families import edit_variant
from library.models.families.edit_variant import EditHooks, EditVariant, ReferenceCounts
from library.models.latent_codec import LatentCodec, ScaledLatentCodec
from library.networks.key_maps import KohyaNames
from library.networks.kind_base import AdapterSettings
from library.networks.kinds import kind_named

if TYPE_CHECKING:
    from library.config.config_view import ConfigView
    from library.config.flow_section import FlowSection
    from library.config.model_schema import ModelSection

PredictionType = Literal["epsilon", "v_prediction", "flow"]
# The batch entry holding each sample's uniform draws for a family's random conditioning choices
# (SD3's text dropout and position crops): [B, n] with n = ModelFamily.conditioning_draws, keyed
# per sample (library.training.step). Training steps add it; validation and sampling do not, so
# they never make those choices at random.
CONDITIONING_DRAWS_KEY = "conditioning_draws"
# Reference images (edit models, which learn "this image, changed as the caption says"): the
# batch entries a training step, validation and the sampler add before assemble_conditioning for
# a family whose ``reference_images`` allows any. REFERENCE_LATENTS_KEY: one tensor per
# reference slot, [B, C, h_k, w_k] (the family codec's layout), the latents of the reference's
# posterior mean (the reference pipelines encode with sample_mode="argmax"). REFERENCE_PIXELS_KEY:
# one tensor per slot, [B, 3, H_k, W_k] in [-1, 1], only for a family whose
# ``text_reads_references`` (its text encoder sees the references, as Qwen-Image-Edit's VL
# encoder does). Every sample of a micro-batch has as many references of the same sizes.
REFERENCE_LATENTS_KEY = "reference_latents"
REFERENCE_PIXELS_KEY = "reference_pixels"
# A clip's first frame as a conditioning input (image-to-video models): the batch entry a
# training step and validation add before assemble_conditioning for a family whose
# FIRST_FRAME_CONDITION is set, [B, C, F', h, w] in the family codec's layout: the latents of
# the posterior mean of the sample's first frame followed by zero pixels to its frame count, as
# the image-to-video pipelines encode their image (diffusers' WanImageToVideoPipeline,
# musubi-tuner's I2V latent cache). An image (one frame) is its own first frame.
FIRST_FRAME_LATENTS_KEY = "first_frame_latents"
# A model with an image encoder (Components.image_encoder: CLIP's vision tower): the batch entry
# a training step and validation add beside FIRST_FRAME_LATENTS_KEY, the encoder's states of
# the sample's first frame [B, T, hidden] (library.models.image_encoders.clip_vision).
FIRST_FRAME_IMAGE_STATES_KEY = "first_frame_image_states"
AdapterRole = Literal["unet", "text_encoder"]


def reference_latents(batch: Mapping | None, device, dtype=None) -> list[torch.Tensor]:
    """The batch's reference latents (REFERENCE_LATENTS_KEY, one tensor per slot) on ``device``
    (in ``dtype`` when given); [] without references."""
    found = (batch or {}).get(REFERENCE_LATENTS_KEY) or ()
    return [r.to(device) if dtype is None else r.to(device, dtype) for r in found]
TargetKind = Literal["linear", "conv"]


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """The data and behaviours the rest of difftune needs from one kind of model.

    ``text_encoder_lora_prefixes`` are kohya's prefixes *without* the joining underscore
    (``lora_te`` + ``_`` + module path); there is one per entry of ``text_encoder_subfolders``,
    in the same order. ``unet_lora_prefix`` (kohya names the denoiser "unet" in every family)
    includes its underscore.
    """

    # Pixels every image side must be a multiple of for the model to run at all: the VAE's 8
    # (SD's UNets pad their up-sampling to the skip connections, so any latent size runs).
    # Class data: known before any weight is read (family_entry.FamilyEntry.family). An edit
    # variant (edit_variant.EditVariant, the ``edit`` field) is no class of its own: the class
    # data it changes (LABEL, REFERENCE_IMAGES, TEXT_READS_REFERENCES) is its entry's data, read
    # through the properties below (label, reference_images, text_reads_references).
    PIXEL_MULTIPLE: ClassVar[int] = 8
    # A bucket step every model of the family runs (its denoiser's grid at the coarsest), for a
    # dataset whose step nobody wrote; None: PIXEL_MULTIPLE. Class data, as PIXEL_MULTIPLE.
    BUCKET_STEP: ClassVar[int | None] = None
    LABEL: ClassVar[str] = "SD"  # the family's name in messages
    # How many reference images a training sample pairs with its target: (least, most), most
    # None for no bound; (0, 0) for a text-to-image family, whose datasets may not name any.
    # Class data, so a dataset is checked against it before any weight is read.
    REFERENCE_IMAGES: ClassVar[tuple[int, int | None]] = (0, 0)
    # Whether the family trains on clips of several frames (video datasets: its latent codec
    # has a frame axis, LatentLayout.takes_clips); False: images only, and a video dataset is
    # refused. Class data, so it is checked before any weight or video is read.
    TRAINS_CLIPS: ClassVar[bool] = False
    # The frame rate a clip family's videos are resampled to where a dataset sets source_fps
    # (musubi-tuner's rule; Wan 2.1 and the Wan 2.2 A14B experts run at 16 fps, TI2V-5B at 24).
    FRAME_RATE: ClassVar[float] = 16.0
    # The side in pixels of the square one denoiser token covers in each latent frame (the
    # VAE's factor times the transformer's patch); None: PIXEL_MULTIPLE, which is exactly that
    # for the transformer families, and a UNet's latent grid (its largest feature map) for SD.
    # Class data, as the two below: the plan counts tokens before any weight is read.
    TOKEN_PIXELS: ClassVar[int | None] = None
    # Frames after the first that a clip family's VAE folds into one latent frame (Wan's VAE
    # and Qwen-Image's, the same network: 4), as LatentLayout.frame_factor.
    FRAMES_PER_LATENT: ClassVar[int] = 4
    # The text encoder reads the reference images with the caption (REFERENCE_PIXELS_KEY and
    # encode_text_with_references): the text cache keys an entry by both.
    TEXT_READS_REFERENCES: ClassVar[bool] = False
    # The denoiser takes the sample's first frame as a condition (FIRST_FRAME_LATENTS_KEY): the
    # data path encodes it beside the sample's latents (cached with them, keyed like them).
    FIRST_FRAME_CONDITION: ClassVar[bool] = False
    # Where the family's adapters go into the denoiser alone: which text encoders get none and
    # whose trainers do the same ("no Qwen3 adapters, as musubi-tuner"), for the note shown when
    # a config asks for text-encoder adapters; None where its text encoders take adapters too.
    # Class data: the run follows it before any weight is read (library.training.family_defaults).
    DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = None

    name: str
    prediction_type: PredictionType
    base_model_version: str  # ss_base_model_version
    modelspec_architecture: str  # modelspec.architecture of a full model; LoRA files add "/lora"
    default_resolution: int
    v2: bool = False  # SD 2.x (kohya's ss_v2, written for every family)
    text_encoder_subfolders: tuple[str, ...] = ("text_encoder",)
    tokenizer_subfolders: tuple[str, ...] = ("tokenizer",)
    text_encoder_lora_prefixes: tuple[str, ...] = ("lora_te",)
    unet_lora_prefix: str = "lora_unet_"
    # Conditioning besides per-token text states: a pooled text embedding, SDXL's image sizes.
    uses_pooled_text_embedding: bool = False
    uses_size_conditioning: bool = False
    lora_implementation: str = "diffusers"  # modelspec.implementation of a LoRA file
    # modelspec.implementation of a full model file: the code whose key layout it uses.
    checkpoint_implementation: str = "https://github.com/Stability-AI/generative-models"
    denoiser_subfolder: str = "unet"  # the denoiser's subfolder in a diffusers model folder
    # scaling_factor of the family's released VAE. Training reads the loaded VAE's config (through
    # latent_codec); this is what VAE configs we write (tiny models) carry.
    latent_scale: float = 0.18215
    # Key layouts a LoRA file of this family can be written in (SavingSection.lora_format).
    lora_formats: tuple[str, ...] = ("kohya",)
    # kohya network_module values that train this family ("networks.lora" trains every family;
    # the others name one family's file layout or adapter kind). The last is the one suggested.
    network_modules: tuple[str, ...] = ("lycoris.kohya", "networks.lora")
    # The edit variant this instance is (its registry entry's), None for the family itself.
    edit: EditVariant | None = None

    @classmethod
    def tokens_per_sample(cls, size: tuple[int, int], frames: int = 1) -> int:
        """The denoiser's sequence length for one sample of ``size`` = (W, H) pixels and
        ``frames`` frames: a token per TOKEN_PIXELS square of each latent frame (a clip of F
        frames has 1 + (F - 1) // FRAMES_PER_LATENT of them, an image one)."""
        side = cls.TOKEN_PIXELS or cls.PIXEL_MULTIPLE
        latent_frames = 1 + (frames - 1) // cls.FRAMES_PER_LATENT
        return latent_frames * (size[0] // side) * (size[1] // side)

    @property
    def label(self) -> str:
        """The family's name in messages (its edit variant's, else LABEL)."""
        return self.edit.label if self.edit else self.LABEL

    @property
    def reference_images(self) -> ReferenceCounts:
        """How many reference images a sample takes (its edit variant's, else REFERENCE_IMAGES)."""
        return self.edit.reference_images if self.edit else self.REFERENCE_IMAGES

    @property
    def text_reads_references(self) -> bool:
        """Its text encoder reads the reference images with the caption
        (REFERENCE_PIXELS_KEY and encode_text_with_references): its edit variant's, else
        TEXT_READS_REFERENCES."""
        return self.edit.text_reads_references if self.edit else self.TEXT_READS_REFERENCES

    @property
    def edit_hooks(self) -> EditHooks | None:
        """Its edit variant's hooks, which the base family calls; None for no edit variant."""
        return self.edit.hooks() if self.edit else None

    def references_text(self) -> str:
        """How many reference images a sample takes, in words ("1 reference image")."""
        return edit_variant.references_text(self.reference_images)

    def sample_reference_size(
        self, size: tuple[int, int], width: int, height: int
    ) -> tuple[int, int]:
        """The (width, height) a sample prompt's reference image of ``size`` is fitted to
        (scaled to cover, center-cropped) before it is encoded, for an image of ``width`` x
        ``height``: that size, unless the edit variant's pipeline sizes references otherwise."""
        hooks = self.edit_hooks
        if hooks is not None and hooks.reference_size is not None:
            return hooks.reference_size(self, size, width, height)
        return width, height

    def takes_references(self, count: int) -> bool:
        """Whether a sample with ``count`` reference images fits the family."""
        return edit_variant.takes_references(self.reference_images, count)

    def edited(self, text: str) -> str:
        """The run plan's description ``text`` of the base family in its edit variant's words."""
        return self.edit.describe(text) if self.edit else text

    @property
    def v_parameterization(self) -> bool:
        """The training target is v (velocity) rather than the added noise."""
        return self.prediction_type == "v_prediction"

    @property
    def modelspec_prediction_type(self) -> str:
        """modelspec.prediction_type spells v-prediction as "v"."""
        return "v" if self.v_parameterization else self.prediction_type

    @property
    def text_cache_name(self) -> str:
        """The family and every family setting that changes encoded captions (a text-encoder
        cache entry's identity)."""
        return self.name

    @property
    def conditioning_draws(self) -> int:
        """How many uniform draws per sample ``assemble_conditioning`` reads from the batch's
        CONDITIONING_DRAWS_KEY entry for random conditioning choices (0: none)."""
        return 0

    @property
    def lora_architecture(self) -> str:
        """modelspec.architecture of a LoRA file trained on this family."""
        return f"{self.modelspec_architecture}/lora"

    def describe(self) -> str:
        """The family and its run settings, for the run plan."""
        return self.name

    # -- behaviours a family implements ------------------------------------------------------

    def predict(
        self,
        denoiser: torch.nn.Module,
        noisy: torch.Tensor,
        timesteps: torch.Tensor,
        cond: Conditioning,
    ) -> torch.Tensor:
        """The denoiser's raw output for noisy latents (in the layout of the family's
        latent_codec, [B, C, h, w] for an image VAE) at ``timesteps``."""
        raise NotImplementedError(f"{self.name} does not define how its denoiser is called")

    def encode_text(
        self,
        tokenizers: Sequence[object],
        text_encoders: Sequence[torch.nn.Module],
        captions: Sequence[str],
        device: torch.device | str,
        clip_skip: int | None = None,
        max_token_length: int | None = None,
    ) -> TextConditioning:
        """The caption-dependent conditioning of ``captions`` (what a text cache stores)."""
        raise NotImplementedError(f"{self.name} does not define its text conditioning")

    def encode_text_with_references(
        self,
        tokenizers: Sequence[object],
        text_encoders: Sequence[torch.nn.Module],
        captions: Sequence[str],
        references: Sequence[torch.Tensor],
        device: torch.device | str,
    ) -> TextConditioning:
        """The conditioning of ``captions`` read together with their reference images
        (``references``: one [B, 3, H, W] tensor in [-1, 1] per reference slot), for a family
        whose ``text_reads_references``: its edit variant's hook."""
        hooks = self.edit_hooks
        if hooks is not None and hooks.text_with_references is not None:
            return hooks.text_with_references(
                self, tokenizers, text_encoders, captions, references, device
            )
        raise NotImplementedError(f"{self.name} does not read reference images with its text")

    def text_mask(
        self, tokenizers: Sequence[object], captions: Sequence[str], device: torch.device | str
    ) -> torch.Tensor | None:
        """[B, T] padding mask of the per-token conditioning, where the family uses one."""
        return None

    def assemble_conditioning(
        self,
        text: TextConditioning,
        batch: Mapping | None,
        device: torch.device | str,
        dtype: torch.dtype | None = None,
    ) -> Conditioning:
        """The denoiser's conditioning from the text part and the batch's per-sample entries."""
        raise NotImplementedError(f"{self.name} does not define its conditioning")

    def trains_text_encoder(self, index: int) -> bool:
        """Text encoder ``index`` gets an adapter when text encoders train (all by default;
        none where DENOISER_ONLY_ADAPTERS says so)."""
        return self.DENOISER_ONLY_ADAPTERS is None

    def unused_text_layers(self, index: int, num_layers: int, clip_skip: int | None) -> range:
        """Layers of text encoder ``index`` whose output never reaches the conditioning."""
        return range(num_layers, num_layers)

    def adapter_targets(
        self, module: torch.nn.Module, role: AdapterRole, conv: bool
    ) -> dict[str, TargetKind]:
        """Module path -> "linear" | "conv" of the layers a default adapter adapts."""
        raise NotImplementedError(f"{self.name} does not define its adapter targets")

    def lycoris_targets(
        self, module: torch.nn.Module, role: AdapterRole, preset: str
    ) -> dict[str, TargetKind]:
        """The layers LyCORIS' ``preset`` adapts in ``module``, for a family that trains
        LyCORIS adapters (``"lycoris.kohya"`` in network_modules)."""
        raise NotImplementedError(f"{self.name} has no LyCORIS adapters")

    def apply_lycoris(
        self, module: torch.nn.Module, role: AdapterRole, spec: object, preset: str
    ) -> None:
        """Give ``module`` the LyCORIS adapters of ``spec`` (a LycorisSpec) on the layers
        ``preset`` adapts: the LyCORIS kind's inject (library.networks.lycoris_kind)."""

        kind_named("lycoris").inject(
            self, module, role, AdapterSettings(None, spec, preset, "lycoris")
        )

    def sampling_pipeline(self):
        """The diffusers pipeline kind (library.sampling.pipelines.PipelineKind) sampling it;
        ConfigError (sample_prompts) when there is none."""
        raise ConfigError(
            f"sample_prompts: sampling {self.name} models during training is not supported; "
            "remove sample_prompts"
        )

    def sampling_weights(self, denoiser: torch.nn.Module):
        """A context in which ``denoiser`` holds the weights samples are drawn with: its own (a
        family may swap in another checkpoint's base weights for the round, its adapters kept,
        and put its own back after)."""
        return contextlib.nullcontext()

    def checkpoint_layout(self):
        """How a full fine-tune is written as one original-layout file; ValueError if never."""
        raise ValueError(f"{self.name} models cannot be saved as one checkpoint file")

    def write_full_model(self, path, denoiser, components, metadata, dtype) -> None:
        """A full fine-tune as the one file users load (atomically): the trained ``denoiser``
        and whatever else of ``components`` the family's file holds."""
        raise NotImplementedError(f"{self.name} does not define its full-model file")

    def full_model_modules(self, components) -> tuple[torch.nn.Module, ...]:
        """The modules a full-model file holds (what its size is reckoned from)."""
        return (components.denoiser, components.vae, *components.text_encoders)

    def adapter_key_map(self):
        """How this family's adapter files name its models' layers
        (library.networks.key_maps.KeyMap): kohya's one-to-one names by default."""

        return KohyaNames(self.text_encoder_lora_prefixes)

    def lora_tensors(self, models: Mapping[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
        """An adapter file's tensors for the adapters of ``models`` (kohya prefix -> model),
        whatever their kind, in the key layout other tools load for this family."""
        return self.adapter_key_map().write(models)

    def diffusers_lora_tensors(
        self, models: Mapping[str, torch.nn.Module]
    ) -> dict[str, torch.Tensor]:
        """The adapters of ``models`` in diffusers' peft layout (lora_format = "diffusers"),
        for a family with "diffusers" in ``lora_formats``."""
        raise NotImplementedError(f"{self.name} writes no diffusers-layout LoRA files")

    def load_lora_tensors(
        self,
        models: Mapping[str, torch.nn.Module],
        tensors: Mapping[str, torch.Tensor],
        source: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Copy an adapter file's tensors into the adapters of ``models`` (``metadata``: its
        header); CheckpointError naming ``source`` for a file that does not fit them."""
        self.adapter_key_map().read(models, tensors, source, metadata)

    def latent_codec(self, vae: torch.nn.Module) -> LatentCodec:
        """How ``vae`` (this family's loaded VAE) turns pixels into the denoiser's latents and
        back: diffusers' AutoencoderKL scale and shift by default."""
        return ScaledLatentCodec(vae)

    def bucket_grid(self, denoiser: torch.nn.Module) -> int:
        """Pixels an image side must be a multiple of for this denoiser (PIXEL_MULTIPLE by
        default)."""
        return self.PIXEL_MULTIPLE

    def use_plain_attention(self, denoiser: torch.nn.Module) -> None:
        """Switch the denoiser from scaled-dot-product attention to plain attention (kohya's
        behaviour with every attention flag off)."""
        raise ConfigError(
            f"sdpa = false: {self.name} models have no plain-attention path here; set sdpa = true"
        )

    def prepare_denoiser(self, denoiser: torch.nn.Module, config: ConfigView) -> None:
        """Set up the loaded denoiser for this run's options before training (nothing by
        default)."""

    def metadata_keys(self, config: ConfigView) -> dict[str, object]:
        """Family-specific ss_* keys of saved files (kohya's update_metadata of its trainer
        for the family); values are stringified by the writer."""
        return {}

    def check_options(self, model: ModelSection, flow: FlowSection) -> None:
        """ConfigError for model options ([model] and [flow] keys) that do not fit this family."""

    def blockwise_spec(
        self,
        args: Mapping[str, object],
        dim: int,
        alpha: float,
        conv_dim: int | None,
        conv_alpha: float | None,
    ):
        """kohya's block-wise networks.lora options ``args`` (network_args key -> value) as this
        family's per-block ranks, alphas and rates; ValueError for a value kohya's rules refuse,
        ConfigError for a family whose denoiser has no kohya blocks (every family but SD's)."""
        raise ConfigError(
            f"{next(iter(args))}: block-wise options number the blocks of an SD or SDXL UNet; "
            f"a {self.name} model has none, so remove it"
        )

    def swap_blocks(self, denoiser, count: int) -> list:
        """The denoiser's blocks whose frozen weights blocks_to_swap keeps in host memory
        (library/training/block_swap.py); ConfigError where the family has no such blocks."""
        raise ConfigError(
            f"blocks_to_swap = {count}: {self.name}'s denoiser has no blocks to swap (block swap "
            "is for transformer denoisers); lower the memory with gradient_checkpointing or "
            "fp8_base instead"
        )

    def check_training(self, config: ConfigView) -> None:
        """ConfigError for training choices this family cannot make (found before loading
        weights where the caller can). Families that add checks call this one too. (A
        network_module of another family is family_choice.check_network_module's to refuse:
        it names the family, which the registry knows.)"""
        layout = config.saving.lora_format
        if config.network.train_mode == "lora" and layout not in self.lora_formats:
            raise ConfigError(
                f'lora_format = "{layout}": {self.name} LoRA files are written in kohya\'s '
                "layout, which diffusers' own loader converts for this family; remove lora_format"
            )


def derived_family(base: ModelFamily, cls: type[ModelFamily], **changes) -> ModelFamily:
    """A family of ``cls`` (a subclass of ``base``'s class: a variant's own behaviours) holding
    every field of ``base`` but ``changes``, as dataclasses.replace would for ``base``'s class."""
    if not isinstance(base, ModelFamily) or not issubclass(cls, type(base)):
        raise TypeError(f"{cls.__name__} does not derive from {type(base).__name__}")
    kept = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return cls(**kept | changes)
