"""SD 1.x/2.x/SDXL's kit for the family conformance suite (tests.kits.conformance_kit)."""

from __future__ import annotations

from pathlib import Path

import torch

from library.models import original_names as names
from library.models.families.sd.family import SD1, SD2, SDXL
from library.saving.checkpoint_export import write_single_file
from library.training.noise import NoiseOptions, draw
from tests.kits.conformance_kit import (
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.sd.tiny import build_tiny_components, save_tiny_model, write_tiny_tokenizer


def _build(variant, seed):
    parts = build_tiny_components(variant, seed)
    return {k: v for k, v in parts.items() if isinstance(v, torch.nn.Module)}


def _unet_to_original(state, config):
    return {names.unet_path_to_original(k, config): v for k, v in state.items()}


def _unet_from_original(original, config):
    return {names.unet_path_from_original(k, config): v for k, v in original.items()}


def _reference_unet(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    prefixed = {names.UNET_PREFIX + k: v for k, v in original.items()}
    return convert_ldm_unet_checkpoint(prefixed, dict(config))


def _levels(config) -> int:
    return len(config["block_out_channels"])


def _reference_vae(original, config):
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    prefixed = {names.VAE_PREFIX + k: v for k, v in original.items()}
    return convert_ldm_vae_checkpoint(prefixed, dict(config))


def _family(variant, modules):

    return SDXL if variant == "sdxl" else SD1


def _inputs(unet, seed):
    config = unet.config
    gen = torch.Generator().manual_seed(seed)
    inputs = {
        "sample": torch.randn(1, config.in_channels, 8, 8, generator=gen),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, 7, config.cross_attention_dim, generator=gen),
    }
    if config.addition_embed_type == "text_time":
        pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        inputs["added_cond_kwargs"] = {
            "text_embeds": torch.randn(1, pooled, generator=gen),
            "time_ids": torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]]),
        }
    return inputs


_FILE_FAMILIES = {"sd1": SD1, "sd2": SD2, "sdxl": SDXL}  # the family each file is written as


def _single_file(path, variant, seed):
    """The original-layout checkpoint (LDM's names; SDXL: SGM's), UNet, VAE and text encoders
    in one file, with the tokenizer folder(s) beside it."""
    modules = _build(variant, seed)
    encoders = [modules[k] for k in ("text_encoder", "text_encoder_2") if k in modules]
    file = Path(path) / f"{variant}.safetensors"
    family = _FILE_FAMILIES[variant]
    write_single_file(file, modules["unet"], modules["vae"], encoders, family, torch.float32)
    if variant == "sdxl":
        tokenizers = Path(path) / "tokenizers"
        for sub in ("tokenizer", "tokenizer_2"):
            write_tiny_tokenizer(tokenizers / sub)
    else:
        tokenizers = write_tiny_tokenizer(Path(path) / "tokenizer")
    return {"pretrained_model_name_or_path": str(file), "tokenizer_path": str(tokenizers)}, {}


def _scheduler(kind: str, prediction: str):
    """diffusers' ``kind`` scheduler on the folder's config, predicting ``prediction``."""

    def scheduler(folder):
        import diffusers

        return getattr(diffusers, kind).from_pretrained(
            folder, subfolder="scheduler", prediction_type=prediction
        )

    return scheduler


def _sample_cases(variant):
    """A prompt with a negative prompt at CFG 7.5: DDIM for SD 1.x, DDIM with v-prediction for
    SD 2.x (v_parameterization reaches the sampler), Euler for SDXL with and without it."""
    prompt = dict(prompt="a blue circle", negative_prompt="green", seed=3, scale=7.5)
    call = {"negative_prompt": "green", "guidance_scale": 7.5}
    kind = "EulerDiscreteScheduler" if variant == "sdxl" else "DDIMScheduler"
    prompt["sampler"] = "euler" if variant == "sdxl" else "ddim"
    if variant == "sdxl":
        prompt |= dict(width=64, height=80)
    keys = {"add_watermarker": False} if variant == "sdxl" else {}
    epsilon = SampleCase(prompt=prompt, call=call,
                         pipeline_keys=keys, scheduler=_scheduler(kind, "epsilon"))  # fmt: skip
    v = SampleCase(
        prompt=prompt, call=call, pipeline_keys=keys,
        model={"v_parameterization": True}, scheduler=_scheduler(kind, "v_prediction"),
        differs=({"scheduler": _scheduler(kind, "epsilon")},),
    )  # fmt: skip
    return {"sd1": (epsilon,), "sd2": (v,), "sdxl": (epsilon, v)}[variant]


def _alpha_bar(steps):
    """SD's scaled-linear schedule: betas from 0.00085 to 0.012 over 1000 steps."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, 0)[steps].float().view(-1, 1, 1, 1)


def _noise(d, training):
    """Target noise and input noise, composed by hand from the keyed draws."""
    offset = training.get("noise_offset", 0.0)
    multires, ip_gamma = training.get("multires_noise_iterations"), training.get("ip_noise_gamma")
    eps = d.noise + offset * d.offset
    if multires:
        eps = eps + d.pyramid
        eps = torch.stack([e / e.std() for e in eps])
    return eps, (eps + ip_gamma * d.ip_noise if ip_gamma else eps)


def _text(pipe, batch) -> tuple[torch.Tensor, dict]:
    """SD 1.x/2.x: CLIP's last hidden states at 77 tokens, nothing else."""
    ids = pipe.tokenizer(batch["captions"], padding="max_length", max_length=77,
                         truncation=True, return_tensors="pt").input_ids  # fmt: skip
    return pipe.text_encoder(ids)[0], {}


def _sdxl_text(pipe, batch) -> tuple[torch.Tensor, dict]:
    """SDXL as StableDiffusionXLPipeline conditions its UNet: encode_prompt (both encoders'
    penultimate layers, joined along the channels; the second's pooled projection) and, through
    added_cond_kwargs, the time ids _get_add_time_ids makes of each sample's sizes, which
    training takes from the batch (the image's original size, the crop's top-left corner, the
    bucket's size, each as height and width)."""
    hidden, _, pooled, _ = pipe.encode_prompt(
        batch["captions"], device=torch.device("cpu"), do_classifier_free_guidance=False
    )
    projection = pipe.text_encoder_2.config.projection_dim
    sizes = zip(
        batch["original_sizes"].tolist(),
        batch["crop_top_lefts"].tolist(),
        batch["target_sizes"].tolist(),
        strict=True,
    )
    time_ids = [
        pipe._get_add_time_ids(
            tuple(original), tuple(crop), tuple(target), hidden.dtype, projection
        )
        for original, crop, target in sizes
    ]
    added = {"text_embeds": pooled, "time_ids": torch.cat(time_ids)}
    return hidden, {"added_cond_kwargs": added}


def reference_loss(pipe, batch, seed, case) -> torch.Tensor:
    """The textbook loss, written out on the pipeline's modules: x_t = sqrt(a) x0 +
    sqrt(1-a) eps; v = sqrt(a) eps - sqrt(1-a) x0; min-SNR, kohya's SNR Huber schedule and
    debiased estimation as their formulas; the UNet conditioned as the pipeline conditions it
    (_text, _sdxl_text)."""
    training = case.training
    gamma = training.get("min_snr_gamma")
    v_pred = bool(case.model.get("v_parameterization"))
    posterior = pipe.vae.encode(batch["pixel_values"]).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    options = NoiseOptions(
        multires_noise_iterations=training.get("multires_noise_iterations", 0),
        ip_noise_gamma=training.get("ip_noise_gamma", 0.0),
    )
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), options)  # fmt: skip
    x0 = (posterior.mean + posterior.std * d.latent_eps) * pipe.vae.config.scaling_factor
    eps, eps_in = _noise(d, training)
    a = _alpha_bar(d.timesteps)
    xt = a.sqrt() * x0 + (1 - a).sqrt() * eps_in
    text = _sdxl_text if pipe.unet.config.addition_embed_type == "text_time" else _text
    hidden, added = text(pipe, batch)
    pred = pipe.unet(xt, d.timesteps, hidden, **added).sample
    target = a.sqrt() * eps - (1 - a).sqrt() * x0 if v_pred else eps
    snr = (a / (1 - a)).view(-1)
    snr_w = (
        torch.clamp(snr, max=gamma) / (snr + 1 if v_pred else snr)
        if gamma
        else torch.ones_like(snr)
    )
    huber_c = training.get("huber_c") if training.get("loss_type") == "huber" else None
    if huber_c:  # kohya's snr schedule: c_t = (1 - c) / (1 + sigma_t)^2 + c
        ct = ((1 - huber_c) / (1 + snr.rsqrt()) ** 2 + huber_c).view(-1, 1, 1, 1)
        elements = 2 * ct * (torch.sqrt((pred - target) ** 2 + ct**2) - ct)
    else:
        elements = (pred - target) ** 2
    if training.get("debiased_estimation_loss"):
        capped = torch.clamp(snr, max=1000)
        snr_w = snr_w * (1 / (capped + 1) if v_pred else capped.rsqrt())
    per_sample = elements.mean(dim=(1, 2, 3))
    return (per_sample * batch["loss_weights"] * snr_w).mean()


# min-SNR with noise offset; then kohya's SNR Huber loss with multires and input-perturbation
# noise and debiased estimation
_LOSS_TRAINING = (
    {},
    {"min_snr_gamma": 5.0, "noise_offset": 0.1},
    {"noise_offset": 0.05, "multires_noise_iterations": 5, "multires_noise_discount": 0.3,
     "ip_noise_gamma": 0.1, "loss_type": "huber", "huber_schedule": "snr", "huber_c": 0.2,
     "debiased_estimation_loss": True, "min_snr_gamma": 5.0},
)  # fmt: skip


def _loss_cases(variant):
    model = {"v_parameterization": True} if variant == "sd2" else {}
    return tuple(LossCase(model=model, training=t) for t in _LOSS_TRAINING)


KIT = ConformanceKit(
    variants=("sd1", "sd2", "sdxl"),
    build=_build,
    write_folder=lambda path, variant, seed: save_tiny_model(path, variant, seed),
    pipeline=lambda v: "StableDiffusionXLPipeline" if v == "sdxl" else "StableDiffusionPipeline",
    family=_family,
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=_unet_to_original,
        from_original=_unet_from_original,
        reference=_reference_unet,
    ),
    vae_names=NameTable(
        to_original=lambda state, config: names.vae_state_dict_to_original(state, _levels(config)),
        from_original=lambda orig, config: names.vae_state_dict_from_original(
            orig, _levels(config)
        ),
        reference=_reference_vae,
    ),
    lora_conv=True,
    write_single_files=_single_file,
    sample_cases=_sample_cases,
    loss_cases=_loss_cases,
    loss_reference=reference_loss,
    # UNet LoRA on the tiny SD 1.x folder (the trainer's other modes on SD, tests/distributed's
    # own, train the text encoder, the whole UNet and LyCORIS besides)
    distributed=(DistributedMode(name="unet-lora", keys={"network_train_unet_only": True}),),
)
