"""FLUX.1's kit for the family conformance suite (tests.kits.conformance_kit)."""

from __future__ import annotations

import math
from dataclasses import replace
from unittest import mock

import torch

from library.config.flow_schema import FlowSection
from library.models.families.flux import original_keys
from library.models.families.flux.family import flux_family
from library.models.families.flux.shapes import VARIANTS
from library.training.noise import NoiseOptions, draw
from tests.kits.conformance_kit import (
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.flux.tiny import build_tiny_flux_components
from tests.kits.flux.tiny_files import write_tiny_flux_files, write_tiny_flux_folder


class TinyWidthTorch:
    """``torch`` as diffusers' FLUX.1 converter sees it, except that ``split`` scales the sizes.

    diffusers splits ``linear1`` at FLUX.1's width (3072, hard-coded); scaling its split sizes to
    the tensor keeps diffusers' order of the parts while letting it read a tiny model."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def split(tensor, sizes, dim=0):
        total = sum(sizes)
        return torch.split(tensor, [s * tensor.shape[dim] // total for s in sizes], dim=dim)


def _reference_transformer(original, config):
    """diffusers' converter, which pops every key it reads: none may be left."""
    from diffusers.loaders import single_file_utils

    checkpoint = dict(original)
    with mock.patch.object(single_file_utils, "torch", TinyWidthTorch()):
        converted = single_file_utils.convert_flux_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _reference_ae(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(dict(original), dict(config))


def _family(variant, modules):

    return flux_family(variant, FlowSection())


def _inputs(transformer, seed):
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    image, text = 16, 8
    inputs = {
        "hidden_states": torch.randn(1, image, config.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(1, text, config.joint_attention_dim, generator=gen),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim, generator=gen),
        "timestep": torch.tensor([0.7]),
        "img_ids": torch.randn(image, 3, generator=gen),
        "txt_ids": torch.zeros(text, 3),
    }
    if config.guidance_embeds:
        inputs["guidance"] = torch.tensor([3.5])
    return inputs


def _linear1_part(path: str) -> bool:
    """The parts of a single block's fused linear1: diffusers' kohya converter splits it at
    FLUX.1's width (tests/networks/test_flux_lora_keys.py reads it at full width)."""
    return path.startswith("single_transformer_blocks.") and path.endswith(
        ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
    )


def _single_files(path, variant, seed):
    """Black Forest Labs' transformer file with ComfyUI's clip_l, t5xxl and ae beside it."""
    files = write_tiny_flux_files(path, variant, seed, dtype=torch.float32)
    model = {"pretrained_model_name_or_path": str(files["transformer"]),
             "tokenizer_path": str(files["tokenizer"])}  # fmt: skip
    flow = {k: str(files[k]) for k in ("clip_l", "t5xxl", "ae")}
    return model, {**flow, "t5_tokenizer_path": str(files["t5_tokenizer"])}


# black-forest-labs/FLUX.1-{dev,schnell} scheduler/scheduler_config.json, written out here so the
# reference does not share the family's table.
RELEASED_SCHEDULERS = {
    "dev": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
    "schnell": dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False,
                    base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                    max_image_seq_len=4096),
}  # fmt: skip
T5_LENGTH = {"dev": 512, "schnell": 256}


def released_scheduler(variant):
    def scheduler(folder):
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler(**RELEASED_SCHEDULERS[variant])

    return scheduler


def _sample_cases(variant):
    """An 80 x 64, 3-step Euler prompt (kohya's Flux default, --l 1). dev: distilled guidance
    3.5 when the prompt gives none, whatever the run trains with (kohya recommends 1.0), the
    negative prompt unused without true CFG; and true CFG (--l 4) with the negative prompt.
    schnell: unshifted, without guidance."""
    prompt = dict(width=80, height=64, steps=3, scale=1.0, sampler="euler", seed=7)
    length = {"max_sequence_length": T5_LENGTH[variant]}
    if variant == "schnell":
        return (
            SampleCase(prompt={**prompt, "prompt": "a blue square", "seed": 3}, call=length,
                       scheduler=released_scheduler("schnell"),
                       differs=({"scheduler": released_scheduler("dev")},)),
        )  # fmt: skip
    return (
        SampleCase(prompt={**prompt, "negative_prompt": "blurry"}, flow={"guidance_scale": 1.0},
                   call={**length, "guidance_scale": 3.5}, scheduler=released_scheduler("dev"),
                   differs=({"guidance_scale": 9.0},)),
        SampleCase(prompt={**prompt, "negative_prompt": "blurry", "scale": 4.0},
                   call={**length, "guidance_scale": 3.5, "negative_prompt": "blurry",
                         "true_cfg_scale": 4.0},
                   scheduler=released_scheduler("dev"), differs=({"true_cfg_scale": 1.0},)),
    )  # fmt: skip


def _sigma(scheme: str, z: torch.Tensor, u: torch.Tensor, shape) -> torch.Tensor:
    """kohya's Flux sigma for each scheme, written from the formulas (defaults: scale 1,
    shift 3, uniform density)."""
    if scheme == "uniform":
        return u
    if scheme == "sigmoid":
        return torch.sigmoid(z)
    if scheme == "shift":
        t = torch.sigmoid(z)
        return 3 * t / (1 + 2 * t)
    if scheme == "flux_shift":
        tokens = (shape[-2] // 2) * (shape[-1] // 2)
        mu = 0.5 + (1.15 - 0.5) * (tokens - 256) / (4096 - 256)
        t = torch.sigmoid(z)
        return math.exp(mu) / (math.exp(mu) + (1 / t - 1))
    # "sigma": index floor(1000 u) of the descending shifted table sigma_k = shift(1 - k / 1000)
    k = torch.floor(u * 1000).clamp(max=999)
    t = 1 - k / 1000
    return 3 * t / (1 + 2 * t)


def reference_loss(pipe, batch, seed, scheme="sigma", prediction="sigma_scaled", t5_length=None):
    """kohya's Flux.1 loss written out on FluxPipeline's parts (its text encoding, packing and
    position ids): x_t = (1 - sigma) x0 + sigma noise, target noise - x0, distilled guidance
    3.5 (dev), the model prediction type's formula."""
    guided = pipe.transformer.config.guidance_embeds
    t5_length = t5_length or T5_LENGTH["dev" if guided else "schnell"]
    posterior = pipe.vae.encode(batch["pixel_values"]).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    sample = posterior.mean + posterior.std * d.latent_eps
    x0 = (sample - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    sigma = _sigma(scheme, d.time_normal, d.time_uniform, shape).view(-1, 1, 1, 1)
    xt = (1 - sigma) * x0 + sigma * d.noise
    text, pooled, text_ids = pipe.encode_prompt(
        batch["captions"], None, max_sequence_length=t5_length
    )
    b, ch, h, w = xt.shape
    packed = pipe._pack_latents(xt, b, ch, h, w)
    image_ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, xt.device, xt.dtype)
    guidance = torch.full((b,), 3.5) if guided else None
    out = pipe.transformer(hidden_states=packed, encoder_hidden_states=text,
                           pooled_projections=pooled, timestep=sigma.view(-1), img_ids=image_ids,
                           txt_ids=text_ids, guidance=guidance).sample  # fmt: skip
    v = pipe._unpack_latents(out, h * 8, w * 8, 8)
    pred = {"raw": v, "additive": v + xt, "sigma_scaled": xt - sigma * v}[prediction]
    per_sample = ((pred - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3))
    return (per_sample * batch["loss_weights"]).mean()


def _loss_reference(pipe, batch, seed, case):
    flow = case.flow
    return reference_loss(pipe, batch, seed, flow.get("timestep_sampling", "sigma"),
                          flow.get("model_prediction_type", "sigma_scaled"))  # fmt: skip


def _loss_cases(variant):
    """Each of kohya's timestep_sampling schemes (raw prediction), each model_prediction_type
    (shift sampling); schnell: the defaults."""
    if variant == "schnell":
        return (LossCase(), LossCase(flow={"model_prediction_type": "raw"}))
    schemes = ("sigma", "uniform", "sigmoid", "shift", "flux_shift")
    cases = [LossCase(flow={"timestep_sampling": s, "model_prediction_type": "raw"})
             for s in schemes]  # fmt: skip
    cases += [LossCase(flow={"timestep_sampling": "shift", "model_prediction_type": p})
              for p in ("additive", "sigma_scaled")]  # fmt: skip
    return tuple(cases)


# LoRA on the transformer, CLIP-L and T5, with the frozen weights in float8 (fp8_base): DDP must
# leave them out of its start-up broadcast. T5's adapters sit after relative-position attention
# and RMS norms, whose float32 sums differ by up to ~2e-6 between layouts after 2 steps
# (observed); a wrong reduction or a missed sample moves them by far more (the 1 x 2 x 1 guard).
LORA_MODE = DistributedMode(
    name="flux-lora",
    keys={
        "network_module": "networks.lora_flux",
        "network_args": ["train_t5xxl=True"],
        "fp8_base": True,
        "timestep_sampling": "shift",
        "model_prediction_type": "raw",
        "guidance_scale": 1.0,
        "bucket_reso_steps": 16,
    },
    ddp_options=("--gradient_checkpointing",),
    atol=5e-6,
    holds=("lora_te3_",),
)
DISTRIBUTED = (
    LORA_MODE,
    # the full fine-tune (the transformer alone)
    DistributedMode(
        name="flux-full",
        keys={**LORA_MODE.keys, "train_mode": "unet", "learning_rate": 1e-3, "network_args": [],
              "fp8_base": False},
        ddp_options=("--ddp_gradient_as_bucket_view",),
    ),  # fmt: skip
    # the LoRA run over an nf4 transformer (base_model_precision; fp8_base then stores the
    # text encoders in float8) with its last double block and both single blocks swapped to
    # host memory (blocks_to_swap): DDP must neither broadcast nor sync the quantized or the
    # host weights, which are no parameters
    replace(LORA_MODE, name="flux-swap-nf4",
            keys={**LORA_MODE.keys, "blocks_to_swap": 2, "base_model_precision": "nf4-bnb"}),  # fmt: skip
)


KIT = ConformanceKit(
    variants=VARIANTS,
    build=lambda variant, seed: build_tiny_flux_components(variant, seed),
    write_folder=write_tiny_flux_folder,
    pipeline=lambda variant: "FluxPipeline",
    family=_family,
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: original_keys.transformer_to_original(state),
        from_original=lambda state, config: original_keys.transformer_from_original(state),
        reference=_reference_transformer,
    ),
    vae_names=NameTable(
        to_original=lambda state, config: original_keys.ae_to_original(state),
        from_original=lambda state, config: original_keys.ae_from_original(state),
        reference=_reference_ae,
    ),
    diffusers_lora_skips=_linear1_part,
    write_single_files=_single_files,
    sample_cases=_sample_cases,
    loss_cases=_loss_cases,
    loss_reference=_loss_reference,
    distributed=DISTRIBUTED,
)
