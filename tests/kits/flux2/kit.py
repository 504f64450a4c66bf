"""FLUX.2's kit for the family conformance suite (ConformanceKit).

klein base and distilled are one architecture: their tiny folders differ in model_index.json's
``is_distilled`` alone, which the loader reads (distilled: no guidance when sampling, and a
warning). The loss reference is written from Flux2KleinPipeline's own parts (its prompt
encoding, patchify, pack, position ids and BatchNorm statistics).
"""

from __future__ import annotations

import math
import os

import torch

from library.models.families.flux2.family import flux2_family
from library.models.families.flux2.names import TABLE
from library.training.noise import NoiseOptions, draw
from tests.kits.conformance_kit import (
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.flux2.tiny import build_tiny_flux2_components, write_tiny_flux2_folder
from tests.kits.flux2.tiny_files import single_files

VARIANTS = ("klein-base", "klein", "dev")


def _reference_transformer(original, config):
    """diffusers' converter, which pops every key it reads: none may be left."""
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers,
    )

    checkpoint = dict(original)
    converted = convert_flux2_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _inputs(transformer, seed):
    """One 4 x 3 latent image and 5 text tokens, with the pipeline's position ids."""
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    ids = torch.cartesian_prod(torch.arange(1), torch.arange(4), torch.arange(3), torch.arange(1))
    text = torch.cartesian_prod(*(torch.arange(1),) * 3, torch.arange(5))
    return {
        "hidden_states": torch.randn(1, 12, config.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(1, 5, config.joint_attention_dim, generator=gen),
        "timestep": torch.tensor([0.3]),
        "img_ids": ids[None],
        "txt_ids": text[None],
    }


def _sample_cases(variant):
    """klein base: its default CFG scale 4 against the empty negative prompt (the pipeline's);
    distilled klein: no guidance, as the pipeline samples it whatever the scale."""
    prompt = dict(prompt="a red cube on a table", seed=11, steps=3, width=80)
    if variant == "klein":
        return (SampleCase(prompt=prompt, call={"guidance_scale": 1.0}),)
    if variant == "dev":  # the scale is the guidance embedding's input, not CFG
        return (SampleCase(prompt=prompt, call={"guidance_scale": 4.0},
                           differs=({"guidance_scale": 1.0},)),)  # fmt: skip
    reference = _reference_image()
    return (
        SampleCase(prompt=prompt, call={"guidance_scale": 4.0},
                   differs=({"guidance_scale": 1.0},)),
        SampleCase(prompt={**prompt, "scale": 1.0}, call={"guidance_scale": 1.0}),
        # an edit: the reference goes to the pipeline as its image, which it encodes itself
        SampleCase(prompt={**prompt, "scale": 1.0, "references": (reference,)},
                   call={"guidance_scale": 1.0, "image": [_opened(reference)]},
                   differs=({"guidance_scale": 1.0, "image": None},)),
    )  # fmt: skip


def _reference_image():
    """A 96 x 64 reference image, written once per process."""
    import tempfile
    from pathlib import Path

    from PIL import Image

    path = Path(tempfile.gettempdir()) / f"flux2-kit-{os.getpid()}" / "reference.png"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = torch.rand(64, 96, 3, generator=torch.Generator().manual_seed(3)) * 255
        Image.fromarray(pixels.to(torch.uint8).numpy()).save(path)
    return path


def _opened(path):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def reference_loss(pipe, batch, seed, case) -> torch.Tensor:
    """The loss from the pipeline's parts: the posterior patched 2x2 and sampled with the
    trainer's keyed draws, normalised by the VAE's BatchNorm statistics; sigma drawn as
    musubi-tuner's flux2_shift (sigmoid(z) shifted by exp(mu), mu on the line through (256, 0.5)
    and (4096, 1.15) at the image's token count) or the case's ``shift``; the transformer at
    sigma on the pipeline's packed tokens, prompt states and ids; target noise - x0."""
    posterior = pipe.vae.encode(batch["pixel_values"]).latent_dist
    mean, std = pipe._patchify_latents(posterior.mean), pipe._patchify_latents(posterior.std)
    shape = tuple(mean.shape[1:])
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    z = mean + std * d.latent_eps
    bn = pipe.vae.bn
    x0 = (z - bn.running_mean.view(1, -1, 1, 1)) / torch.sqrt(
        bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps
    )
    u = torch.sigmoid(d.time_normal)
    h, w = shape[-2:]
    if case.flow.get("timestep_sampling") == "shift":
        shift = case.flow["discrete_flow_shift"]
    else:
        shift = math.exp(0.5 + (1.15 - 0.5) / (4096 - 256) * (h * w - 256))
    sigma = shift * u / (1 + (shift - 1) * u)
    s = sigma.view(-1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    embeds, text_ids = pipe.encode_prompt(batch["captions"])
    ids = pipe._prepare_latent_ids(noisy)
    # dev's guidance input: the family's default 4 (the pipeline's default scale)
    guidance = torch.full((len(sigma),), 4.0) if pipe.transformer.config.guidance_embeds else None
    out = pipe.transformer(hidden_states=pipe._pack_latents(noisy), timestep=sigma * 1000 / 1000,
                           guidance=guidance, encoder_hidden_states=embeds, txt_ids=text_ids,
                           img_ids=ids, return_dict=False)[0]  # fmt: skip
    prediction = pipe._unpack_latents_with_ids(out, ids)  # ids span the whole image
    per_sample = ((prediction - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3))
    return (per_sample * batch["loss_weights"]).mean()


# LoRA (musubi-tuner's targets, kohya's fused names) trained as 2 processes and as one, resumed
# from step 1; then the transformer sharded (FSDP2).
_LORA = DistributedMode(
    name="flux2-lora",
    keys={
        "network_module": "networks.lora_flux_2",
        "network_train_unet_only": True,
        "bucket_reso_steps": 16,
    },
    ddp_options=("--gradient_checkpointing",),
    only=("lora_unet_double_blocks_", "lora_unet_single_blocks_"),
    resume=True,
)

# The same with a reference image per sample (the image mirrored at another size), at T = 10.
_EDIT = DistributedMode(name="flux2-edit", keys=_LORA.keys, only=_LORA.only, references=True)

KIT = ConformanceKit(
    variants=VARIANTS,
    build=lambda variant, seed: build_tiny_flux2_components(seed, variant == "dev"),
    write_folder=write_tiny_flux2_folder,
    pipeline=lambda variant: "Flux2Pipeline" if variant == "dev" else "Flux2KleinPipeline",
    family=lambda variant, modules: flux2_family(
        "dev" if variant == "dev" else "klein", "custom", variant == "klein"
    ),
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: TABLE.to_original(state),
        from_original=lambda original, config: TABLE.from_original(original),
        reference=_reference_transformer,
    ),
    write_single_files=single_files,
    # dev's Mistral 3 file is read as the language model alone (its vision tower is unused)
    file_module=lambda variant, module: (
        module.model.language_model if variant == "dev" and hasattr(module, "model") else module
    ),
    sample_cases=_sample_cases,
    loss_cases=lambda variant: (
        LossCase(),
        LossCase(flow={"timestep_sampling": "shift", "discrete_flow_shift": 2.0}),
    ),
    loss_reference=reference_loss,
    distributed=(_LORA, _LORA.sharding("flux2-fsdp"), _EDIT),
    skips={
        "vae_names": "diffusers has no single-file converter of the FLUX.2 VAE to check against; "
        "tests/models/flux2/test_flux2_vae_file.py checks its original names",
    },
)
