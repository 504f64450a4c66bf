"""SD3/SD3.5's kit for the family conformance suite (tests.kits.conformance_kit)."""

from __future__ import annotations

import copy
import math

import torch

from library.config.flow_schema import FlowSection
from library.models.families.sd3 import original_keys
from library.models.families.sd3.family import sd3_family
from library.models.families.sd3.shapes import VARIANTS
from library.training.noise import NoiseOptions, draw
from tests.kits.conformance_kit import (
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.sd3.tiny import build_tiny_sd3_components
from tests.kits.sd3.tiny_files import write_tiny_sd3_files, write_tiny_sd3_folder

# The default variant first: 3.5 Medium has every kind of block (dual attention, qk norms).
_VARIANTS = ("sd3.5-medium", *(v for v in VARIANTS if v != "sd3.5-medium"))


def _reference_transformer(original, config):
    """diffusers' converter (on the keys as they are inside a model file), which pops every
    key it reads: none may be left."""
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    checkpoint = {original_keys.ORIGINAL_PREFIX + k: v for k, v in original.items()}
    converted = convert_sd3_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _reference_vae(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    prefixed = {original_keys.VAE_PREFIX + k: v for k, v in original.items()}
    return convert_ldm_vae_checkpoint(prefixed, dict(config))


def _family(variant, modules):

    encoders = tuple(modules[f"text_encoder{s}"] for s in ("", "_2", "_3"))
    return sd3_family(variant, FlowSection(), encoders)


def _inputs(transformer, seed):
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    return {
        "hidden_states": torch.randn(1, config.in_channels, 8, 8, generator=gen),
        "encoder_hidden_states": torch.randn(1, 6, config.joint_attention_dim, generator=gen),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim, generator=gen),
        "timestep": torch.tensor([500.0]),
    }


def _single_file(path, variant, seed):
    """Stability's one file with the MMDiT, the VAE and the three text encoders inside."""
    files = write_tiny_sd3_files(path, variant, seed, text_encoders_inside=True,
                                 dtype=torch.float32)  # fmt: skip
    model = {"pretrained_model_name_or_path": str(files["model"]),
             "tokenizer_path": str(files["tokenizer"])}  # fmt: skip
    return model, {"t5_tokenizer_path": str(files["t5_tokenizer"])}


# stabilityai/stable-diffusion-3.5-large scheduler/scheduler_config.json (shift 3.0), written
# out here so the reference does not share the family's table.
RELEASED_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)


def _released_scheduler(folder):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**RELEASED_SCHEDULER)


def released_clip_g(tokenizer):
    """CLIP-G's tokenizer as released (stabilityai's tokenizer_2 pads with token id 0; the tiny
    folder's pads with its end token), a copy."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(0)
    return tokenizer


def _released_tokenizers(folder):
    from transformers import CLIPTokenizer

    return {"tokenizer_2": released_clip_g(CLIPTokenizer.from_pretrained(folder / "tokenizer_2"))}


def _sample_cases(variant):
    """An 80 x 64, 3-step Euler prompt with classifier-free guidance 4 and a negative prompt;
    another guidance scale or negative prompt gives another image."""
    prompt = dict(width=80, height=64, steps=3, scale=4.0, sampler="euler", seed=7,
                  negative_prompt="blurry")  # fmt: skip
    call = {"negative_prompt": "blurry", "guidance_scale": 4.0}
    differs = ({"guidance_scale": 9.0}, {"negative_prompt": "sharp"})
    return (
        SampleCase(prompt=prompt, call=call, scheduler=_released_scheduler, differs=differs,
                   pipeline_keys=_released_tokenizers),
    )  # fmt: skip


def _density(scheme: str, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The SD3 paper's densities as maps of the draws (kohya's defaults: mean 0, std 1,
    mode scale 1.29)."""
    if scheme == "logit_normal":
        return 1 / (1 + torch.exp(-z))
    if scheme == "mode":
        return 1 - u - 1.29 * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
    return u


def _weight(scheme: str, sigma: torch.Tensor) -> torch.Tensor:
    if scheme == "sigma_sqrt":
        return sigma**-2
    if scheme == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigma + 2 * sigma**2))
    return torch.ones_like(sigma)


def reference_loss(pipe, batch, seed, scheme="uniform", shift=1.0, zero=()) -> torch.Tensor:
    """kohya's sd3_train_network loss, written out on StableDiffusion3Pipeline's parts (its
    text encoding); ``zero`` names encoder parts dropped for every sample ("l", "g", "t5")."""
    posterior = pipe.vae.encode(batch["pixel_values"]).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    x0 = posterior.mean + posterior.std * d.latent_eps
    x0 = (x0 - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    u = _density(scheme, d.time_normal, d.time_uniform)
    u = u * shift / (1 + (shift - 1) * u)
    sigma = torch.floor(u * 1000) / 1000
    s = sigma.view(-1, 1, 1, 1)
    xt = s * d.noise + (1 - s) * x0
    captions = batch["captions"]
    if pipe.tokenizer_2.pad_token_id != 0:
        pipe = copy.copy(pipe)
        pipe.tokenizer_2 = released_clip_g(pipe.tokenizer_2)
    text, _, pooled, _ = pipe.encode_prompt(captions, captions, captions,
                                            do_classifier_free_guidance=False,
                                            max_sequence_length=256)  # fmt: skip
    l_width = pipe.text_encoder.config.hidden_size
    g_width = pipe.text_encoder_2.config.hidden_size
    l_pool = pipe.text_encoder.config.projection_dim
    if "l" in zero:
        text[:, :77, :l_width] = 0
        pooled[:, :l_pool] = 0
    if "g" in zero:
        text[:, :77, l_width : l_width + g_width] = 0
        pooled[:, l_pool:] = 0
    if "t5" in zero:
        text[:, 77:] = 0
    out = pipe.transformer(hidden_states=xt, encoder_hidden_states=text,
                           pooled_projections=pooled, timestep=sigma * 1000).sample  # fmt: skip
    pred = out * (-s) + xt
    per_sample = ((pred - x0) ** 2).mean(dim=(1, 2, 3)) * _weight(scheme, sigma)
    return (per_sample * batch["loss_weights"]).mean()


def _loss_reference(pipe, batch, seed, case):
    flow = case.flow
    return reference_loss(pipe, batch, seed, flow.get("weighting_scheme", "uniform"),
                          flow.get("training_shift", 1.0))  # fmt: skip


def _loss_cases(variant):
    """The default variant: each weighting scheme at training_shift 1 and 3; the others:
    logit_normal."""
    if variant != _VARIANTS[0]:
        return (LossCase(), LossCase(flow={"weighting_scheme": "logit_normal"}))
    schemes = ("uniform", "logit_normal", "mode", "sigma_sqrt", "cosmap")
    return tuple(LossCase(flow={"weighting_scheme": s, "training_shift": shift})
                 for s in schemes for shift in (1.0, 3.0))  # fmt: skip


# LoRA on the MMDiT, CLIP-L and CLIP-G (FLUX.1's mode covers T5 adapters), with kohya's SD3
# timestep density and every text encoder's dropout and the random position crops at 0.5: each
# sample's draws must follow the sample, not its rank or micro-batch.
DISTRIBUTED = (
    DistributedMode(
        name="sd3-lora",
        keys={
            "network_module": "networks.lora_sd3",
            "weighting_scheme": "logit_normal",
            "training_shift": 3.0,
            "clip_l_dropout_rate": 0.5,
            "clip_g_dropout_rate": 0.5,
            "t5_dropout_rate": 0.5,
            "pos_emb_random_crop_rate": 0.5,
            "bucket_reso_steps": 16,
        },
        ddp_options=("--gradient_checkpointing",),
        holds=("lora_te2_",),
    ),
)


KIT = ConformanceKit(
    variants=_VARIANTS,
    build=lambda variant, seed: build_tiny_sd3_components(variant, seed),
    write_folder=write_tiny_sd3_folder,
    pipeline=lambda variant: "StableDiffusion3Pipeline",
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
        reference=_reference_vae,
    ),
    write_single_files=_single_file,
    sample_cases=_sample_cases,
    loss_cases=_loss_cases,
    loss_reference=_loss_reference,
    distributed=DISTRIBUTED,
)
