"""The single file of diffusers' ``AutoencoderKLFlux2``: the 32-channel autoencoder whose latents
are normalised by BatchNorm running statistics (library/models/patched_latent_codec.py), for
every family on that VAE.

Black Forest Labs and Comfy-Org ship it (``flux2-vae.safetensors``) in the LDM autoencoder
names of the 16-channel ``ae.safetensors``, with its quant convolutions inside the encoder and
decoder (``encoder.quant_conv``, ``decoder.post_quant_conv``) and the statistics as
``bn.running_mean`` / ``bn.running_var``; a file in diffusers' names is read too. Its config is
the header's, else the one its shapes show (GroupNorm's groups: 32 where they divide every
width); a file without the statistics (FLUX.1's ae.safetensors) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.family_entry import Deferred
from library.models.families.file_plans import plan_autoencoder
from library.models.original_names import ldm_vae_from_original
from library.models.plans import Plan

VAE_CLASS = "diffusers:AutoencoderKLFlux2"
_MOVED = {"encoder.quant_conv.": "quant_conv.", "decoder.post_quant_conv.": "post_quant_conv."}


def vae_from_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The original file's tensors -> AutoencoderKLFlux2's (the batch count, which the file
    need not hold and nothing reads, 0 when absent)."""
    moved = {}
    for key, value in state.items():
        old = next((o for o in _MOVED if key.startswith(o)), None)
        moved[_MOVED[old] + key[len(old) :] if old else key] = value
    stats = {k: moved.pop(k) for k in [k for k in moved if k.startswith("bn.")]}
    stats.setdefault("bn.num_batches_tracked", torch.zeros((), dtype=torch.long))
    return {**ldm_vae_from_original(moved), **stats}


def plan_batchnorm_vae(file: CheckpointFile, key: str, label: str, fix: str) -> Plan:
    """The VAE file ``key`` names by the shared autoencoder reader; ModelError "``key`` = file
    is no ``label``: problem; ``fix``" for a file that holds none."""

    def wrong(problem: str) -> ModelError:
        return ModelError(f"{key} = {file.path} is no {label}: {problem}; {fix}")

    if not any(k.endswith("bn.running_mean") for k in file):
        raise wrong("it has no bn.running_mean (the latents' statistics)")
    build = Deferred(VAE_CLASS).get  # the class, imported on first use
    return plan_autoencoder(
        file, key, ("vae.", "first_stage_model."), vae_from_original, {"norm_num_groups": 32},
        label, None, wrong, build=lambda config: build().from_config(config),
    )  # fmt: skip
