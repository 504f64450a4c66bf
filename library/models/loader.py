"""Load a model, offline, frozen, in one dtype (the VAE may stay float32).

Which family's loader reads a path is asked of the family registry
(library.models.families.family_choice: each family knows its diffusers folders and single
files), with the config checks that find a config written for another family before anything
loads; then the options every family shares (the VAE replacement of ModelSection's ``vae``).
What the loaders share sits below the families: the Components they return
(library.models.components) and the checked file reading (library.models.model_files).
"""

from __future__ import annotations

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.components import Components
from library.models.families.family_choice import check_config_family, entry_for
from library.models.vae_file import load_vae


def load_components(
    model: ModelSection,
    weight_dtype: torch.dtype,
    flow: FlowSection | None = None,
    network_module: str | None = None,
) -> Components:
    """Load the model ``pretrained_model_name_or_path`` names, with the family that reads it.

    ``flow`` is the config's [flow] section (a flow-matching model's component files and
    options; unset: all keys unset). Then the options every family shares: the family's own
    option checks, and ``vae`` (a replacement VAE). Nothing touches the network. Raises
    ModelError for any problem with the model's files, ConfigError for options that do not fit
    the model: before anything loads, those of a config written for another family (its
    [flow] keys or ``network_module``).
    """
    flow = flow if flow is not None else FlowSection()
    vae_dtype = torch.float32 if model.no_half_vae else weight_dtype
    entry = entry_for(model, flow)
    check_config_family(entry, model, flow, network_module)
    parts = entry.load(model, flow, weight_dtype, vae_dtype)
    parts.family.check_options(model, flow)
    if model.vae and not entry.reads_vae:  # read from its header alone in the dry run
        vae = load_vae(model.vae, parts.vae.config, vae_dtype)
        own, given = parts.vae.config.latent_channels, vae.config.latent_channels
        if given != own:  # an SD VAE for FLUX.1 (or the reverse) would fail at the first step
            raise ModelError(
                f"vae = {model.vae} makes {given}-channel latents and this {parts.family.name} "
                f"model takes {own}; set vae to a VAE of this model's family (or remove it)"
            )
        parts.vae = vae
    return parts
