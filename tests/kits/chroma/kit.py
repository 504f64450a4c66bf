"""Chroma's kit for the family conformance suite (tests.kits.conformance_kit).

The plain reference loss is written from ChromaPipeline's own parts (its prompt encoding, packing
and position ids) with the pipeline's attention mask as booleans (conditioning.py says why).
The sample cases keep every caption within one padding token of its T5 length, where the
pipeline's own float mask and a boolean one attend alike (tests/models/chroma checks sampling
with more padding against the pipeline given boolean masks).
"""

from __future__ import annotations

import math
from unittest import mock

import torch

from library.config.flow_schema import FlowSection
from library.models.families.chroma import original_keys
from library.models.families.chroma.family import chroma_family
from library.training.noise import NoiseOptions, draw
from tests.kits.chroma.tiny import (
    build_tiny_chroma_components,
    write_tiny_chroma_folder,
)
from tests.kits.chroma.tiny_files import write_tiny_chroma_files
from tests.kits.conformance_kit import (
    FOUR_LENGTH_CAPTIONS,
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.flux.kit import TinyWidthTorch

VARIANT = "chroma"
_NO_TABLE = "Chroma's AE files are FLUX.1's (its kit checks their names)"


def _reference_transformer(original, config):
    """diffusers' converter (its split sizes scaled to the tiny width, as for FLUX.1), which
    pops every key it reads: none may be left."""
    from diffusers.loaders import single_file_utils

    checkpoint = dict(original)
    with mock.patch.object(single_file_utils, "torch", TinyWidthTorch()):
        converted = single_file_utils.convert_chroma_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _inputs(transformer, seed):
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    image, text = 16, 8
    return {
        "hidden_states": torch.randn(1, image, config.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(1, text, config.joint_attention_dim, generator=gen),
        "timestep": torch.tensor([0.7]),
        "img_ids": torch.randn(image, 3, generator=gen),
        "txt_ids": torch.zeros(text, 3),
        "attention_mask": torch.tensor([[True] * 5 + [False] * 3 + [True] * image]),
    }


def _single_files(path, variant, seed):
    """The transformer in the original names with FLUX.1's t5xxl and ae files and T5's
    tokenizer folder, the sizes read off the shapes (no header config)."""
    files = write_tiny_chroma_files(path, seed, config_metadata=False)
    flow = {"t5xxl": str(files["t5xxl"]), "ae": str(files["ae"]),
            "t5_tokenizer_path": str(files["t5_tokenizer"])}  # fmt: skip
    return {"pretrained_model_name_or_path": str(files["transformer"])}, flow


def _linear1_part(path: str) -> bool:
    """The parts of a single block's fused linear1: diffusers' kohya converter splits it at
    FLUX.1's width (3072, hard-coded), which the tiny model does not have."""
    return path.startswith("single_transformer_blocks.") and path.endswith(
        ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
    )


def _sample_cases(variant):
    """A 3-step Euler prompt without guidance (--l 1) and with the pipeline's CFG 5 and a
    negative prompt; 9 T5 tokens, which both captions fill (the tiny tokenizer has one piece
    per character and the word-start mark)."""
    prompt = dict(prompt="a red circle", negative_prompt="blurry", width=80, height=64, steps=3,
                  sampler="euler", seed=7)  # fmt: skip
    flow = {"t5xxl_max_token_length": 9}
    call = {"max_sequence_length": 9}
    return (
        SampleCase(prompt={**prompt, "scale": 1.0}, flow=flow, call={**call, "guidance_scale": 1.0},
                   differs=({"max_sequence_length": 6},)),
        SampleCase(prompt={**prompt, "scale": 5.0}, flow=flow,
                   call={**call, "guidance_scale": 5.0, "negative_prompt": "blurry"},
                   differs=({"guidance_scale": 1.0}, {"negative_prompt": "sharp"})),
    )  # fmt: skip


def _sigma(scheme: str, z: torch.Tensor, u: torch.Tensor, shape) -> torch.Tensor:
    """kohya's FLUX.1 sigma draws (which its Chroma trainer shares), from the formulas
    (defaults: scale 1, shift 3, uniform density)."""
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
    k = torch.floor(u * 1000).clamp(max=999)
    t = 1 - k / 1000
    return 3 * t / (1 + 2 * t)


def reference_loss(pipe, batch, seed, scheme="sigma", prediction="sigma_scaled", t5_length=512):
    """The rectified-flow loss written out on ChromaPipeline's parts: its T5 encoding and mask
    (as booleans), packing and position ids; x_t = (1 - sigma) x0 + sigma noise, the
    transformer at timestep sigma, target noise - x0, the model prediction type's formula."""
    posterior = pipe.vae.encode(batch["pixel_values"]).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    sample = posterior.mean + posterior.std * d.latent_eps
    x0 = (sample - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    sigma = _sigma(scheme, d.time_normal, d.time_uniform, shape).view(-1, 1, 1, 1)
    xt = (1 - sigma) * x0 + sigma * d.noise
    text, text_ids, text_mask, *_ = pipe.encode_prompt(
        batch["captions"], do_classifier_free_guidance=False, max_sequence_length=t5_length
    )
    b, ch, h, w = xt.shape
    packed = pipe._pack_latents(xt, b, ch, h, w)
    image_ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, xt.device, xt.dtype)
    mask = pipe._prepare_attention_mask(b, packed.shape[1], xt.dtype, text_mask.bool())
    out = pipe.transformer(hidden_states=packed, encoder_hidden_states=text,
                           timestep=sigma.view(-1), img_ids=image_ids, txt_ids=text_ids,
                           attention_mask=mask).sample  # fmt: skip
    v = pipe._unpack_latents(out, h * 8, w * 8, 8)
    pred = {"raw": v, "additive": v + xt, "sigma_scaled": xt - sigma * v}[prediction]
    per_sample = ((pred - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3))
    return (per_sample * batch["loss_weights"]).mean()


def _loss_reference(pipe, batch, seed, case):
    flow = case.flow
    return reference_loss(pipe, batch, seed, flow.get("timestep_sampling", "sigma"),
                          flow.get("model_prediction_type", "sigma_scaled"),
                          flow.get("t5xxl_max_token_length", 512))  # fmt: skip


def _loss_cases(variant):
    """The defaults, each timestep_sampling scheme with the raw prediction, the additive
    prediction, and a shorter caption length."""
    cases = [LossCase()]
    cases += [LossCase(flow={"timestep_sampling": s, "model_prediction_type": "raw"})
              for s in ("uniform", "shift", "flux_shift")]  # fmt: skip
    cases.append(LossCase(flow={"timestep_sampling": "shift", "model_prediction_type": "additive"}))
    cases.append(LossCase(flow={"t5xxl_max_token_length": 32}))
    return tuple(cases)


# LoRA on the transformer with captions of four lengths: T5's padding differs between a caption
# alone and in a batch of 4, and the mask (each caption's tokens and its first padding token)
# must make both train the same LoRA.
DISTRIBUTED = (
    DistributedMode(
        name="chroma-lora",
        keys={"network_train_unet_only": True, "bucket_reso_steps": 16},
        ddp_options=("--gradient_checkpointing",),
        captions=FOUR_LENGTH_CAPTIONS,
        only=("lora_unet_",),
    ),
)

KIT = ConformanceKit(
    variants=(VARIANT,),
    build=lambda variant, seed: build_tiny_chroma_components(seed),
    write_folder=write_tiny_chroma_folder,
    pipeline=lambda variant: "ChromaPipeline",
    family=lambda variant, modules: chroma_family(FlowSection()),
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: original_keys.transformer_to_original(state),
        from_original=lambda state, config: original_keys.transformer_from_original(state),
        reference=_reference_transformer,
    ),
    diffusers_lora_skips=_linear1_part,
    write_single_files=_single_files,
    sample_cases=_sample_cases,
    loss_cases=_loss_cases,
    loss_reference=_loss_reference,
    distributed=DISTRIBUTED,
    skips={"vae_names": _NO_TABLE},
)
