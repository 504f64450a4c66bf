"""What the flow-matching transformer families (Flux.1, SD3) share.

Their text encoders are one or two CLIPs followed by T5-XXL (which gets an adapter only with
kohya's train_t5xxl); a LoRA adapts kohya's modules of the transformer, some of them fused layers
(library.networks.fused_keys), and is written in kohya's names; images are cut into 2x2 patches
of the VAE's 8x-downsampled latents, so sides are multiples of 16; and the SD settings GUIs write
into every config are accepted at the values that change nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from library.errors import ConfigError
from library.models.families import denoiser_adapters as adapters
from library.models.families.base import ModelFamily, PredictionType
from library.models.families.flow_options import check_flow_model_options
from library.models.families.spec import FamilySpec
from library.models.families.spec_loader import write_main_file
from library.networks.fused_keys import target_paths, text_encoder_modules
from library.networks.key_maps import OriginalNames
from library.networks.lycoris_targets import lycoris_targets
from library.networks.table_modules import table_modules
from library.networks.targets import default_targets
from library.training.flow_keys import SIGMA_KEYS
from library.training.objectives import FlowOptions, flow_options_over

log = logging.getLogger(__name__)

# SD settings front ends write into their FLUX.1 / SD3 configs (the kohya_ss GUI at these values,
# lora-scripts clip_skip = 2, LoRA_Easy_Training_Scripts max_token_length = 225). kohya's
# trainers for these families do not read them (flux_train_network.py and sd3_train_network.py
# say max_token_length is not used and warn about v_parameterization; no FLUX.1 / SD3 text
# strategy takes clip_skip), so another value is named in a warning and changes nothing, as there.


def swappable_tails(*groups: tuple[str, list, int], count: int) -> list:
    """The last ``n`` blocks of each (kind, blocks, n) group, for blocks_to_swap = ``count``.
    (kohya's trainers keep two blocks of each kind on the device for their rotation; streaming
    each weight needs none, so every block may be swapped.)"""
    chosen = []
    for kind, blocks, n in groups:
        if n > len(blocks):
            raise ConfigError(
                f"blocks_to_swap = {count} would swap {n} {kind} blocks, and the model has "
                f"{len(blocks)}: lower blocks_to_swap"
            )
        chosen += list(blocks)[len(blocks) - n :] if n else []
    return chosen


def dual_single_tails(transformer, count: int) -> list:
    """kohya's block-swap split of a transformer with dual- and single-stream blocks
    (flux_models.enable_block_swap): half the count in dual-stream blocks, and two single-stream
    blocks (each about half a dual-stream block's size) for every other one."""
    double, single = count // 2, (count - count // 2) * 2
    return swappable_tails(
        ("double", transformer.transformer_blocks, double),
        ("single", transformer.single_transformer_blocks, single),
        count=count,
    )


def flow_metadata(options, keys: tuple[str, ...] = SIGMA_KEYS) -> dict:
    """The run's flow-matching draw and loss weighting (a FlowOptions), in kohya's ss_* names:
    the draw keys, or the ``keys`` of the options a family's trainer writes."""
    return {f"ss_{key}": getattr(options, key) for key in keys}


@dataclass(frozen=True)
class TrainerDraw:
    """A family's flow-matching draw: its trainer's suggested one (``defaults``: FlowOptions
    fields), which the set [flow] draw keys override, and the ``keys`` of it that the family's
    files record (kohya's ss_* names; the trainer's update_metadata)."""

    defaults: Mapping[str, object]
    keys: tuple[str, ...] = SIGMA_KEYS

    def options(self, flow: object) -> FlowOptions:
        """The objective's options: the set [flow] draw keys over the defaults."""
        return flow_options_over(flow, self.defaults)

    def metadata(self, flow: object) -> dict:
        """The run's draw (``options``) in kohya's ss_* names, for a saved file's header."""
        return flow_metadata(self.options(flow), self.keys)


@dataclass(frozen=True, kw_only=True)
class TransformerFamily(ModelFamily):
    """A flow-matching transformer family. Subclasses give ``transformer_modules`` (kohya's
    modules of their denoiser), ``FLOW_KIND`` (their name in the family registry, whose entry
    says which [flow] keys apply) and ``LABEL`` (the name in messages); an edit variant's are
    its entry's (``flow_kind``, ``label``)."""

    FLOW_KIND: ClassVar[str]
    LABEL: ClassVar[str]
    # The VAE's 8 times the 2x2 patches the transformer cuts the latents into.
    PIXEL_MULTIPLE: ClassVar[int] = 16
    # LyCORIS presets whose classes this transformer lacks (they would adapt nothing).
    LYCORIS_EMPTY_PRESETS: ClassVar[tuple[str, ...]] = ("unet-convblock-only",)
    # The family's kohya trainer reads split_qkv (its default: one adapter per fused layer), so
    # a LoRA run is told that q, k and v train apart here; False where no trainer reads it.
    SPLIT_QKV_NOTE: ClassVar[bool] = True
    # The spec whose main file a full fine-tune is written as (the transformer alone in the
    # original names, its config in the header for exact reloading); None: the family's own.
    MAIN_FILE: ClassVar[FamilySpec | None] = None
    # kohya's modules of the transformer from MAIN_FILE's name table: every Linear of these
    # (original, diffusers) block lists (None: every list of the table), which the LoRA adapts
    # and a file names.
    LORA_LISTS: ClassVar[tuple[tuple[str, str], ...] | None] = None

    prediction_type: PredictionType = "flow"
    denoiser_subfolder: str = "transformer"
    # With the text encoders training: T5 (the last encoder) gets an adapter too (train_t5xxl).
    train_t5: bool = False

    @property
    def flow_kind(self) -> str:
        """Its name in the family registry: its edit variant's entry's, else FLOW_KIND."""
        return self.edit.entry if self.edit else self.FLOW_KIND

    def transformer_modules(self, transformer) -> list:
        """kohya's modules (library.networks.fused_keys.KohyaModule) of the transformer that
        this run adapts: those of MAIN_FILE's table's LORA_LISTS."""
        if self.MAIN_FILE is None:
            raise NotImplementedError(f"{self.name} does not define its transformer modules")
        prefix = self.unet_lora_prefix.rstrip("_")
        return table_modules(transformer, prefix, self.MAIN_FILE.main.names, self.LORA_LISTS)

    def lycoris_modules(self, transformer, preset: str) -> list:
        """The transformer's modules (KohyaModule) LyCORIS' ``preset`` adapts, as LyCORIS
        chooses them in sd-scripts' original model classes: those of ``transformer_modules``
        (the blocks' Linears), for attn-only the blocks' attention ones (``_attn.`` paths)."""
        modules = self.transformer_modules(transformer)
        if preset == "attn-only":
            return [m for m in modules if "_attn." in m.original]
        return modules

    # -- adapters ----------------------------------------------------------------------------

    def trains_text_encoder(self, index):
        """None with DENOISER_ONLY_ADAPTERS; else every CLIP, and T5-XXL (the last encoder)
        only with train_t5xxl, as kohya."""
        if self.DENOISER_ONLY_ADAPTERS:
            return False
        return index < len(self.text_encoder_subfolders) - 1 or self.train_t5

    def adapter_targets(self, module, role, conv):
        if self.DENOISER_ONLY_ADAPTERS:
            adapters.transformer_only(role, self.label)
        if role == "unet":
            return dict.fromkeys(target_paths(self.transformer_modules(module)), "linear")
        if type(module).__name__ == "T5EncoderModel":
            t5_prefix = self.text_encoder_lora_prefixes[-1]
            return dict.fromkeys(target_paths(text_encoder_modules(module, t5_prefix)), "linear")
        return default_targets(module, "text_encoder", conv=False)  # the CLIPs, as for SD

    def lycoris_targets(self, module, role, preset):
        """The CLIP text encoders' layers, as for SD (the transformer's LyCORIS adapters span
        fused layers: lycoris_modules names them)."""

        return lycoris_targets(module, role, preset, named_layers=False)

    def file_modules(self, transformer) -> list:
        """Every module (KohyaModule) of the original model a file may name for the
        transformer: the key map's denoiser entries, whichever kind and preset adapt them
        (those of ``transformer_modules`` where MAIN_FILE's table gives them)."""
        if self.MAIN_FILE is None:
            raise NotImplementedError(f"{self.name} does not define its file modules")
        return self.transformer_modules(transformer)

    def adapter_key_map(self):
        """The transformer in kohya's names of the original model (fused layers as one module);
        the text encoders in kohya's plain names (lora_te1_, ...), as for SD."""

        return OriginalNames(
            self.text_encoder_lora_prefixes, self.unet_lora_prefix, self.file_modules
        )

    def _check_lycoris(self, config):
        """What LyCORIS does not do on this transformer, refused by name."""
        flow, adapter = config.flow, config.adapter
        for key in ("split_qkv", "train_blocks"):
            if getattr(flow, key) is not None:
                modules = dict.fromkeys(entry.network_module for entry in flow.readers(key))
                raise ConfigError(
                    f"{key} is an argument of kohya's {' / '.join(modules)}, which LyCORIS does "
                    'not read; remove it or use network_module = "networks.lora"'
                )
        if flow.train_t5xxl:
            raise ConfigError(
                "train_t5xxl: LyCORIS adapts no T5-XXL layer (its presets name no T5 block); "
                'remove it, or use network_module = "networks.lora" for T5 adapters'
            )
        if config.saving.lora_format == "diffusers":
            raise ConfigError(
                'lora_format = "diffusers" holds LoRA factors only; LyCORIS files are written in '
                "kohya's names (ComfyUI loads them); remove lora_format"
            )
        preset = adapter.preset or "full"
        if preset in self.LYCORIS_EMPTY_PRESETS:
            raise ConfigError(
                f"preset = {preset} adapts no layer of {self.label}'s transformer; use full, "
                "full-lin or attn-mlp"
            )

    # -- full fine-tunes ---------------------------------------------------------------------

    def write_full_model(self, path, denoiser, components, metadata, dtype):
        if self.MAIN_FILE is None:
            return super().write_full_model(path, denoiser, components, metadata, dtype)
        write_main_file(self.MAIN_FILE, path, denoiser, metadata, dtype)

    def full_model_modules(self, components):
        if self.MAIN_FILE is None:
            return super().full_model_modules(components)
        return (components.denoiser,)

    # -- sizes, options ----------------------------------------------------------------------

    def bucket_grid(self, denoiser):
        """The VAE's 8 times the 2x2 patches: image sides in multiples of 16."""
        return self.PIXEL_MULTIPLE

    def check_options(self, model, flow):
        """[flow] keys of other families, SD model settings (v2, v_parameterization) and
        zero_terminal_snr, and kohya's shared fused adapter (split_qkv=False); SD text settings
        (clip_skip, max_token_length) at other values than the GUI's get a warning."""
        check_flow_model_options(model, flow, self.flow_kind, self.label, True)
        if flow.split_qkv is False:
            raise ConfigError(
                "network_args split_qkv=False: one adapter shared by a fused layer's q, k and v "
                "(kohya's default) is not supported yet; difftune trains them separately, as "
                "split_qkv=True does; remove split_qkv"
            )

    def check_training(self, config):
        super().check_training(config)
        if config.network.network_module == "lycoris.kohya":
            self._check_lycoris(config)
        elif (
            config.network.train_mode == "lora"
            and self.SPLIT_QKV_NOTE
            and config.flow.split_qkv is None
        ):
            log.warning(
                "%s LoRA: q, k and v get separate adapters, as kohya's split_qkv=True; kohya's "
                "default shares one per fused layer. The saved file has kohya's fused names "
                "either way",
                self.label,
            )
        lycoris = config.network.network_module == "lycoris.kohya"
        # LyCORIS' conv rank applies to SD3's patch-embedding conv, and GUIs always write it
        if config.network.conv_dim is not None and not lycoris:
            raise ConfigError(
                f"conv_dim: {self.label}'s transformer has no convolutions to adapt; remove it"
            )
