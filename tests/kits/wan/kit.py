"""Wan's kit for the family conformance suite (ConformanceKit): Wan 2.1 T2V trained on images
(one-frame clips). What the suite's properties cannot ask of Wan is said in ``skips``."""

from __future__ import annotations

import torch

from library.models.families.wan.family import WAN, WAN_TI2V
from library.models.families.wan.keys import TABLE
from tests.kits.conformance_kit import (
    FOUR_LENGTH_CAPTIONS,
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.video_reference import shifted_clip
from tests.kits.wan.tiny import (
    build_tiny_wan_components,
    build_tiny_wan_ti2v_components,
    write_tiny_wan_folder,
    write_tiny_wan_ti2v_folder,
)
from tests.kits.wan.tiny_files import write_tiny_wan_files, write_tiny_wan_ti2v_files


def _inputs(transformer, seed):
    """One 2-frame 8 x 8 latent clip and a caption of 7 states."""
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    return {
        "hidden_states": torch.randn(1, config.in_channels, 2, 8, 8, generator=gen),
        "encoder_hidden_states": torch.randn(1, 7, config.text_dim, generator=gen),
        "timestep": torch.tensor([300.0]),
    }


def single_files(path, variant, seed):
    """The transformer in the original names (ComfyUI's prefix for "comfy"), umT5's file, the
    VAE's and the tokenizer folder (TI2V-5B's: Comfy-Org's files of the transformer and the
    Wan 2.2 VAE)."""
    write = write_tiny_wan_ti2v_files if variant == "ti2v" else write_tiny_wan_files
    files = write(path, seed, comfy=variant in ("comfy", "ti2v"))
    model = {"pretrained_model_name_or_path": str(files["transformer"]), "vae": str(files["vae"])}
    return model, {"t5": str(files["t5"]), "t5_tokenizer_path": str(files["tokenizer"])}


def _reference_names(original, config):
    """diffusers' single-file converter of Wan's original transformer layout."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    return convert_wan_transformer_to_diffusers(dict(original))


def _sample_cases(variant):
    """The pipeline's CFG with an empty negative prompt, and an unguided prompt at another
    size, each on the folder's UniPC scheduler (TI2V-5B: none here, the "sample" skip)."""
    if variant == "ti2v":
        return ()
    return (
        SampleCase(
            prompt=dict(
                prompt="a red cube on a table", negative_prompt="", seed=11, steps=3, scale=5.0
            ),  # fmt: skip
            call={"guidance_scale": 5.0, "negative_prompt": "", "num_frames": 1},
            differs=({"guidance_scale": 1.0},),
        ),
        SampleCase(
            prompt=dict(prompt="a blue sphere", scale=1.0, seed=4, steps=2, width=80),
            call={"guidance_scale": 1.0, "num_frames": 1},
        ),
    )


def reference_loss(
    pipe, batch, seed, shift=3.0, low=0, high=1000, condition=None, transformer=None,
    image_embeds=None,
) -> torch.Tensor:  # fmt: skip
    """The loss written out from the pipeline's parts and facts: the VAE's posterior of the
    one-frame clip normalised per channel, the inverse of the pipeline's decoding
    ((z - latents_mean) / latents_std), noisy = (1 - sigma) x0 + sigma noise, the transformer at
    timestep 1000 sigma on the pipeline's prompt embeddings (512 tokens, zero past each
    caption; TI2V-5B's pipeline: that timestep for every token), target noise - x0; the trainer's keyed draws and musubi-tuner's "shift" draw,
    narrowed linearly into min_timestep..max_timestep. ``condition``: what an image-to-video
    transformer reads after the noisy latents (channels); ``transformer``: unset, the pipe's;
    ``image_embeds``: the CLIP image states Wan 2.1 I2V-14B's transformer reads."""
    x0, d, sigma = shifted_clip(pipe.vae, batch, seed, shift)
    sigma = sigma * (high - low) / 1000 + low / 1000
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    states, _ = pipe.encode_prompt(list(batch["captions"]), do_classifier_free_guidance=False,
                                   max_sequence_length=512, device=torch.device("cpu"))  # fmt: skip
    timestep = sigma * 1000
    if pipe.config.expand_timesteps:
        # WanPipeline's per-token timesteps (TI2V-5B): its mask's ones, one per 1x2x2 patch
        ones = torch.ones(x0.shape)[0][0][:, ::2, ::2].flatten()
        timestep = timestep.view(-1, 1) * ones
    inputs = noisy if condition is None else torch.cat([noisy, condition], dim=1)
    images = {} if image_embeds is None else {"encoder_hidden_states_image": image_embeds}
    out = (transformer or pipe.transformer)(hidden_states=inputs, timestep=timestep,
                                            encoder_hidden_states=states, return_dict=False,
                                            **images)[0]  # fmt: skip
    per_sample = ((out - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3, 4))
    return (per_sample * batch["loss_weights"]).mean()


def _loss_cases(variant):
    """musubi-tuner's draw, then another shift inside a timestep range (TI2V-5B: none here,
    the "loss" skip)."""
    if variant == "ti2v":
        return ()
    return (
        LossCase(),
        LossCase(
            flow={"discrete_flow_shift": 5.0}, training={"min_timestep": 200, "max_timestep": 900}
        ),
    )


def _loss_reference(pipe, batch, seed, case):
    flow, training = case.flow, case.training
    return reference_loss(
        pipe,
        batch,
        seed,
        flow.get("discrete_flow_shift", 3.0),
        training.get("min_timestep", 0),
        training.get("max_timestep", 1000),
    )


# LoRA (musubi-tuner's ten Linears of every block) on images (then clips) whose captions have four lengths,
# each kept at its own length in the text cache and padded back with zeros to 512 tokens: alone
# or in the batch of 4 they must train the same LoRA, and a run resumed from its step-1 state
# must end on the same weights.
DISTRIBUTED = (
    DistributedMode(
        name="wan-lora",
        keys={
            "network_module": "networks.lora_wan",
            "network_train_unet_only": True,
            "bucket_reso_steps": 16,
        },  # fmt: skip
        ddp_options=("--gradient_checkpointing",),
        captions=FOUR_LENGTH_CAPTIONS,
        only=("lora_unet_blocks_",),
        resume=True,
    ),
    # the same on clips of 5 frames (2 latent frames) cut from four short videos, on Wan 2.2
    # TI2V-5B (its 48-channel VAE and a timestep per latent token: the clip path of the T2V
    # models and more)
    DistributedMode(
        name="wan-clips",
        keys={"network_module": "networks.lora_wan", "network_train_unet_only": True},
        variant="ti2v",
        captions=FOUR_LENGTH_CAPTIONS,
        only=("lora_unet_blocks_",),
        resume=True,
        clips=5,
    ),
)

KIT = ConformanceKit(
    variants=("t2v", "comfy", "ti2v"),
    build=lambda variant, seed: (
        build_tiny_wan_ti2v_components if variant == "ti2v" else build_tiny_wan_components
    )(seed),
    write_folder=lambda path, variant, seed: (
        write_tiny_wan_ti2v_folder if variant == "ti2v" else write_tiny_wan_folder
    )(path, seed),
    pipeline=lambda variant: "WanPipeline",
    family=lambda variant, modules: WAN_TI2V if variant == "ti2v" else WAN,
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: TABLE.to_original(state),
        from_original=lambda original, config: TABLE.from_original(original),
        reference=_reference_names,
    ),
    sample_cases=_sample_cases,
    loss_cases=_loss_cases,
    loss_reference=_loss_reference,
    distributed=DISTRIBUTED,
    write_single_files=single_files,
    skips={
        "vae_names": "Wan's VAE file names are Qwen-Image's (its name table is checked there)",
        "lycoris_fused": "Wan's LyCORIS files name each Linear; no fused original layer",
        # the suite's sizes (64 x 48 images, an 80-pixel side) are off TI2V-5B's 32-pixel grid
        "sample": "TI2V-5B's sample on its 32-pixel grid is tests/models/wan/test_wan_ti2v.py's",
        "loss": "TI2V-5B's loss on its 32-pixel grid is tests/models/wan/test_wan_ti2v.py's",
    },
)
