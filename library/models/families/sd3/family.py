"""SD3 and SD3.5 (Medium, Large): a rectified-flow MMDiT conditioned on CLIP-L, CLIP-G and T5-XXL.

The facts this implementation relies on (docs/formats.md, SD3 / SD3.5):

- latents: the VAE's 16 channels, ``(sample - 0.0609) * 1.5305`` (from the VAE's config); the
  MMDiT patches them 2x2 itself, so image sides are multiples of 16;
- text: CLIP-L's and CLIP-G's penultimate hidden states (77 tokens each) side by side on the
  channels (768 + 1280), zero-padded to T5's width (4096), then T5-XXL's last hidden states
  (256 tokens by default) appended on the tokens: [B, 77 + 256, 4096]. The pooled conditioning
  is both CLIPs' projected pooled outputs side by side (2048). CLIP-G pads with token id 0;
- apply_lg_attn_mask / apply_t5_attn_mask mask the caption's padding inside the text encoders
  only; the MMDiT attends to every token (kohya's SD3 trainer passes it no mask);
- clip_l/clip_g/t5_dropout_rate replace one encoder's output of a sample by zeros;
- pos_emb_random_crop_rate / enable_scaled_pos_embed change the position table's crop and
  scale (library.models.families.sd3.position);
- timestep: sigma * 1000 (the MMDiT embeds it as is);
- LoRA files: kohya's names from the original module tree (library.models.families.sd3.lora_keys).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from library.errors import ConfigError
from library.models.checkpoint_parts import CONFIG_METADATA
from library.models.components import Components
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families.base import CONDITIONING_DRAWS_KEY
from library.models.families.sd3.lora_keys import (
    diffusers_lora_tensors,
    embedder_modules,
    import_diffusers_lora,
    is_diffusers_layout,
    transformer_modules,
)
from library.models.families.sd3.objective import SD3FlowObjective
from library.models.families.sd3.original_keys import ae_to_original, transformer_to_original
from library.models.families.sd3.position import crops, install
from library.models.families.sd3.sampling import sd3_pipeline_kind, sd3_scheduler_config
from library.models.families.sd3.spec import SPEC
from library.models.families.spec_loader import load_spec
from library.models.families.transformer_family import TransformerFamily, swappable_tails
from library.networks.fused_keys import load_adapter_weights
from library.networks.kohya_names import unwrap
from library.networks.lycoris_targets import PRESETS
from library.saving.streamed import block_groups, save_streamed
from library.training.objectives import FlowOptions

CLIP_TOKENS = 77
# kohya's and diffusers' T5 length for SD3 captions
T5_TOKENS = 256

# Our variant name -> (kohya's model type after "stable-diffusion-3-", its ss_base_model_version)
_KOHYA_TYPES = {
    "sd3-medium": "medium",
    "sd3.5-medium": "5-medium",
    "sd3.5-large": "5-large",
}
# Conditioning entry of a training step's per-sample position-crop draws ([B, 3]).
POSITION_DRAWS = "position_draws"
TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")  # CLIP-L, CLIP-G, T5
_LABELS = {"sd3-medium": "SD3 Medium", "sd3.5-medium": "SD3.5 Medium", "sd3.5-large": "SD3.5 Large"}


@dataclass(frozen=True, kw_only=True)
class SD3Family(TransformerFamily):
    """SD3 Medium, SD3.5 Medium or SD3.5 Large with the run's text settings.

    The widths of the loaded encoders (``clip_widths``, ``pooled_widths``: CLIP-L's then
    CLIP-G's hidden and projection sizes) say where each encoder's part of the conditioning
    lies, for the per-encoder dropout.
    """

    FLOW_KIND: ClassVar[str] = "sd3"
    LABEL: ClassVar[str] = "SD3"
    # sd-scripts' MMDiT has no class LyCORIS' attn-only preset names (its attention is
    # AttentionLinears), and no ResNet blocks.
    LYCORIS_EMPTY_PRESETS: ClassVar[tuple[str, ...]] = ("attn-only", "unet-convblock-only")

    variant: str = "sd3.5-large"
    t5_max_length: int = T5_TOKENS
    t5_attention_mask: bool = False  # apply_t5_attn_mask
    clip_attention_mask: bool = False  # apply_lg_attn_mask
    # clip_l / clip_g / t5 dropout rates
    dropout_rates: tuple[float, float, float] = (0.0, 0.0, 0.0)
    clip_widths: tuple[int, int] = (768, 1280)
    pooled_widths: tuple[int, int] = (768, 1280)
    # kohya's pos_emb_random_crop_rate and enable_scaled_pos_embed
    # (library.models.families.sd3.position)
    position_crop_rate: float = 0.0
    scaled_positions: bool = False

    def describe(self) -> str:
        masks = [name for name, on in (("CLIP", self.clip_attention_mask),
                                       ("T5", self.t5_attention_mask)) if on]  # fmt: skip
        masked = f", {' and '.join(masks)} padding masked" if masks else ""
        extras = [
            f"{name} dropout {rate:g}"
            for name, rate in zip(("CLIP-L", "CLIP-G", "T5"), self.dropout_rates, strict=True)
            if rate
        ]
        if self.position_crop_rate:
            extras.append(f"position crops at random {self.position_crop_rate:g}")
        if self.scaled_positions:
            extras.append("position tables scaled per resolution")
        listed = "".join(f", {extra}" for extra in extras)
        return f"{_LABELS[self.variant]} ({self.t5_max_length} T5 tokens{masked}{listed})"

    @property
    def text_cache_name(self) -> str:
        masks = ("|clip_mask" if self.clip_attention_mask else "") + (
            "|t5_mask" if self.t5_attention_mask else ""
        )
        return f"{self.name}|t5_tokens={self.t5_max_length}{masks}"

    @property
    def conditioning_draws(self) -> int:
        """Uniform draws per sample: one per text encoder for the dropout, then whether to crop
        the position table at random and where (row, column); when either option is on."""
        return 6 if any(self.dropout_rates) or self.position_crop_rate else 0

    # -- conditioning ------------------------------------------------------------------------

    def encode_text(
        self, tokenizers, text_encoders, captions, device, clip_skip=None, max_token_length=None
    ):
        """[B, 77 + T5 tokens, T5 width] hidden states and [B, 2048] pooled (see the module)."""
        captions = list(captions)
        hidden, pooled = [], []
        for tokenizer, encoder in zip(tokenizers[:2], text_encoders[:2], strict=True):
            tokens = self._tokens(tokenizer, captions, CLIP_TOKENS)
            mask = tokens.attention_mask.to(device) if self.clip_attention_mask else None
            out = encoder(
                tokens.input_ids.to(device),
                attention_mask=mask,
                output_hidden_states=True,
                return_dict=True,
            )
            # The penultimate layer without the final layer norm, as SD3 was trained.
            hidden.append(out.hidden_states[-2])
            pooled.append(out.text_embeds)
        t5_tokens = self._tokens(tokenizers[2], captions, self.t5_max_length)
        mask = t5_tokens.attention_mask.to(device) if self.t5_attention_mask else None
        t5 = text_encoders[2](t5_tokens.input_ids.to(device), attention_mask=mask)
        t5_hidden = t5.last_hidden_state
        clip = torch.cat(hidden, dim=-1)
        clip = F.pad(clip, (0, t5_hidden.shape[-1] - clip.shape[-1]))
        context = torch.cat([clip.to(t5_hidden.dtype), t5_hidden], dim=-2)
        return TextConditioning(context, torch.cat(pooled, dim=-1))

    @staticmethod
    def _tokens(tokenizer, captions, length):
        return tokenizer(
            captions,
            padding="max_length",
            max_length=length,
            truncation=True,
            return_tensors="pt",
        )

    def assemble_conditioning(self, text, batch, device, dtype=None):
        hidden, pooled = text.hidden.to(device), text.pooled.to(device)
        if dtype is not None:
            hidden, pooled = hidden.to(dtype), pooled.to(dtype)
        kwargs = {"pooled_projections": pooled}
        draws = None if batch is None else batch.get(CONDITIONING_DRAWS_KEY)
        if draws is not None and any(self.dropout_rates):
            hidden, pooled = self._drop(hidden, pooled, draws[:, :3].to(device))
            kwargs["pooled_projections"] = pooled
        if draws is not None and self.position_crop_rate:
            kwargs[POSITION_DRAWS] = draws[:, 3:6]  # float32: a cast could move a draw
        return Conditioning(hidden, kwargs)

    def _drop(self, hidden, pooled, draws):
        """Zero each sample's CLIP-L, CLIP-G and T5 parts where its draw is below the rate."""
        rates = torch.tensor(self.dropout_rates, device=draws.device)
        keep = (draws >= rates).to(hidden.dtype)  # [B, 3]
        (l_width, g_width), (l_pooled, g_pooled) = self.clip_widths, self.pooled_widths
        channels = torch.ones(hidden.shape[0], 1, hidden.shape[-1], device=hidden.device)
        channels = channels.to(hidden.dtype)
        clip_rows = channels.repeat(1, CLIP_TOKENS, 1)
        clip_rows[:, :, :l_width] *= keep[:, 0, None, None]
        clip_rows[:, :, l_width : l_width + g_width] *= keep[:, 1, None, None]
        t5_rows = channels.repeat(1, hidden.shape[1] - CLIP_TOKENS, 1) * keep[:, 2, None, None]
        hidden = hidden * torch.cat([clip_rows, t5_rows], dim=1)
        pooled_keep = torch.cat(
            [keep[:, :1].expand(-1, l_pooled), keep[:, 1:2].expand(-1, g_pooled)], dim=1
        )
        return hidden, pooled * pooled_keep

    def predict(self, denoiser, noisy, timesteps, cond):
        with crops(unwrap(denoiser), cond.unet_kwargs.get(POSITION_DRAWS)):
            return denoiser(
                hidden_states=noisy,
                encoder_hidden_states=cond.encoder_hidden_states,
                pooled_projections=cond.unet_kwargs["pooled_projections"],
                # sigma in [0, 1] -> the MMDiT's timestep in [0, 1000], in float32: the weight
                # dtype (bf16) would round it to steps of up to 4.
                timestep=timesteps.float() * 1000,
                return_dict=False,
            )[0]

    # -- adapters ----------------------------------------------------------------------------

    def transformer_modules(self, transformer):
        """kohya's networks.lora_sd3 modules of the MMDiT: every Linear of every joint block."""
        return transformer_modules(transformer)

    def swap_blocks(self, transformer, count):
        return swappable_tails(("joint", transformer.transformer_blocks, count), count=count)

    def file_modules(self, transformer):
        """kohya's modules of the joint blocks, then the embedders' LyCORIS adapts."""

        return transformer_modules(transformer) + embedder_modules(transformer, conv=True)

    def lycoris_modules(self, transformer, preset):
        """Every Linear of the joint blocks (LyCORIS' SingleDiTBlock class), plus what LyCORIS'
        PatchEmbed and TimestepEmbedding classes catch in the original MMDiT: the timestep MLP
        always, the patch-embedding conv where the preset adapts convs (full, unet-only)."""
        return transformer_modules(transformer) + embedder_modules(
            transformer, conv=PRESETS[preset].convs
        )

    def diffusers_lora_tensors(self, models):
        """transformer.* / text_encoder.* / text_encoder_2.* peft keys, which diffusers'
        StableDiffusion3Pipeline.load_lora_weights (and ComfyUI) read; T5 has no place there."""
        try:
            return diffusers_lora_tensors(models)
        except ValueError as exc:
            raise ConfigError(f'lora_format = "diffusers": {exc}') from None

    def load_lora_tensors(self, models, tensors, source, metadata=None):
        """kohya's layout (TransformerFamily), or the diffusers layout lora_format writes."""
        if not is_diffusers_layout(tensors):
            super().load_lora_tensors(models, tensors, source, metadata)
            return
        weights = import_diffusers_lora(models, tensors, source, metadata)
        for prefix, per_path in weights.items():
            load_adapter_weights(models[prefix], per_path, source)

    def sampling_pipeline(self):
        """StableDiffusion3Pipeline fed our conditioning (library.models.families.sd3.sampling)."""
        return sd3_pipeline_kind()

    # -- sizes, options, files ---------------------------------------------------------------

    def metadata_keys(self, config):
        """kohya's SD3 keys (its defaults where the [flow] key is unset), and training_shift,
        which kohya leaves out though it changes what was trained."""
        o = FlowOptions.from_section(config.flow)
        return {
            "ss_apply_lg_attn_mask": self.clip_attention_mask,
            "ss_apply_t5_attn_mask": self.t5_attention_mask,
            "ss_weighting_scheme": o.weighting_scheme,
            "ss_logit_mean": o.logit_mean,
            "ss_logit_std": o.logit_std,
            "ss_mode_scale": o.mode_scale,
            "ss_training_shift": o.training_shift,
        }

    def prepare_denoiser(self, denoiser, config):
        """kohya's position-table options on the MMDiT: random crops, and tables scaled to
        the datasets' resolutions (library.models.families.sd3.position)."""
        if not (self.position_crop_rate or self.scaled_positions):
            return
        resolutions = None
        if self.scaled_positions:
            resolutions = [tuple(d.resolution) for d in config.datasets]
        install(denoiser, self.position_crop_rate, resolutions)

    def check_training(self, config):
        super().check_training(config)
        t5_trains = config.flow.train_t5xxl and not config.network.network_train_unet_only
        if config.saving.lora_format == "diffusers" and t5_trains:
            raise ConfigError(
                'lora_format = "diffusers" has no place for T5 adapters (diffusers\' SD3 loader '
                "reads the MMDiT, CLIP-L and CLIP-G); remove train_t5xxl or lora_format"
            )

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        """The trained MMDiT and the VAE in Stability AI's single-file layout
        (``model.diffusion_model.``, ``first_stage_model.``), as sd3.5_large.safetensors is
        distributed and kohya's SD3 trainer saves it; the text encoders stay the user's files.
        The diffusers configs ride in the header (difftune.config.*) for exact reloading."""
        import json

        def mmdit(state):
            return {f"model.diffusion_model.{k}": v for k, v in transformer_to_original(state).items()}

        def autoencoder(state):
            return {f"first_stage_model.{k}": v for k, v in ae_to_original(state).items()}

        vae = components.vae
        # one block at a time: the fused tensors of a block are built only while it is written
        groups = [(b, mmdit) for b in block_groups(denoiser.state_dict(), ("transformer_blocks.",))]
        groups.append((vae.state_dict(), autoencoder))
        header = {
            CONFIG_METADATA + "transformer": json.dumps(
                dict(denoiser.config), default=list, sort_keys=True
            ),
            CONFIG_METADATA + "vae": json.dumps(dict(vae.config), default=list, sort_keys=True),
            **dict(metadata or {}),
        }
        save_streamed(path, groups, header, dtype)

    def full_model_modules(self, components):
        return (components.denoiser, components.vae)


def _variant(variant: str, **data) -> SD3Family:
    return SD3Family(
        name=variant,
        prediction_type="flow",
        base_model_version=_KOHYA_TYPES[variant],
        modelspec_architecture=f"stable-diffusion-3-{_KOHYA_TYPES[variant]}",
        default_resolution=1024,
        text_encoder_subfolders=TEXT_ENCODERS,
        tokenizer_subfolders=("tokenizer", "tokenizer_2", "tokenizer_3"),
        text_encoder_lora_prefixes=("lora_te1", "lora_te2", "lora_te3"),
        uses_pooled_text_embedding=True,
        denoiser_subfolder="transformer",
        latent_scale=1.5305,
        lora_formats=("kohya", "diffusers"),
        network_modules=("lycoris.kohya", "networks.lora", "networks.lora_sd3"),
        variant=variant,
        **data,
    )


SD3_MEDIUM = _variant("sd3-medium")
SD35_MEDIUM = _variant("sd3.5-medium")
SD35_LARGE = _variant("sd3.5-large")
VARIANT_FAMILIES = {f.variant: f for f in (SD3_MEDIUM, SD35_MEDIUM, SD35_LARGE)}


def sd3_family(variant: str, flow, text_encoders=()) -> SD3Family:
    """The family of ``variant`` with the [flow] section's text settings (unset: kohya's
    defaults) and, given the loaded (CLIP-L, CLIP-G, T5), their widths."""
    changes: dict = {}
    if flow.t5xxl_max_token_length is not None:
        changes["t5_max_length"] = int(flow.t5xxl_max_token_length)
    if flow.apply_t5_attn_mask:
        changes["t5_attention_mask"] = True
    if flow.apply_lg_attn_mask:
        changes["clip_attention_mask"] = True
    if flow.train_t5xxl:
        changes["train_t5"] = True
    if flow.pos_emb_random_crop_rate:
        changes["position_crop_rate"] = float(flow.pos_emb_random_crop_rate)
    if flow.enable_scaled_pos_embed:
        changes["scaled_positions"] = True
    rates = (flow.clip_l_dropout_rate, flow.clip_g_dropout_rate, flow.t5_dropout_rate)
    if any(rates):
        changes["dropout_rates"] = tuple(float(r or 0.0) for r in rates)
    if text_encoders:
        clips = text_encoders[:2]
        changes["clip_widths"] = tuple(e.config.hidden_size for e in clips)
        changes["pooled_widths"] = tuple(e.config.projection_dim for e in clips)
    return dataclasses.replace(VARIANT_FAMILIES[variant], **changes)


def load_sd3(model, flow, weight_dtype: torch.dtype, vae_dtype: torch.dtype):
    """Components of an SD3/SD3.5 model (a diffusers folder, or the single files; sd3/spec.py):
    text encoders and tokenizers are (CLIP-L, CLIP-G, T5); kohya's SD3 objective and family."""
    loaded = load_spec(SPEC, model, flow, weight_dtype, vae_dtype)
    encoders = tuple(loaded.modules[sub] for sub in TEXT_ENCODERS)
    clip_l, clip_g, t5 = loaded.tokenizers.values()  # in the spec's order
    return Components(
        denoiser=loaded.modules["transformer"],
        vae=loaded.modules["vae"],
        text_encoders=encoders,
        tokenizers=(clip_l, pad_with_id_zero(clip_g), t5),
        objective=SD3FlowObjective(FlowOptions.from_section(flow), sd3_scheduler_config()),
        family=sd3_family(loaded.facts, flow, encoders),
        model_dir=loaded.model_dir,
    )


def pad_with_id_zero(tokenizer):
    """CLIP-G's tokenizer padding with token id 0, as SD3 was trained (the released
    tokenizer_2 already does; one found elsewhere pads with its end token)."""
    if tokenizer.pad_token_id != 0:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(0)
    return tokenizer
