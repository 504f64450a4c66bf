"""Qwen-Image's kit for the family conformance suite (tests.kits.conformance_kit).

One variant (the text-to-image model). What the suite's properties cannot ask of Qwen-Image is
said in ``skips``.
"""

from __future__ import annotations

import torch

from library.models.families.qwenimage.family import qwenimage_family
from library.models.wan_vae_keys import vae_from_original, vae_to_original
from tests.kits.conformance_kit import (
    FOUR_LENGTH_CAPTIONS,
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.qwenimage.tiny import (
    build_tiny_qwenimage_components,
    write_tiny_qwenimage_folder,
)
from tests.kits.qwenimage.tiny_files import write_tiny_qwenimage_files
from tests.kits.video_reference import shifted_clip


def _inputs(transformer, seed):
    """One 8 x 8 latent packed into 16 tokens of 2x2 patches and one caption of 7 states."""
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    return {
        "hidden_states": torch.randn(1, 16, config.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(1, 7, config.joint_attention_dim, generator=gen),
        "timestep": torch.tensor([0.3]),
        "img_shapes": [[(1, 4, 4)]],
    }


def single_files(path, seed, **flow):
    """Comfy-Org's transformer, Qwen2.5-VL and VAE files, with the tokenizer folder; ``flow``:
    more [flow] keys (an edit release's model_version)."""
    files = write_tiny_qwenimage_files(path, seed, dtype=torch.float32)
    model = {"pretrained_model_name_or_path": str(files["transformer"]),
             "tokenizer_path": str(files["tokenizer"]), "vae": str(files["vae"])}  # fmt: skip
    return model, {"text_encoder": str(files["text_encoder"]), **flow}


def _reference_vae(original, config):
    """diffusers' single-file converter of Wan 2.1's VAE, whose layout ComfyUI's Qwen-Image
    VAE file has."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    return convert_wan_vae_to_diffusers(dict(original))


def _sample_cases(variant):
    """The pipeline's default true CFG (scale 4 with an empty negative prompt, which the
    pipeline counts as given) and an unguided prompt at another size."""
    return (
        SampleCase(
            prompt=dict(prompt="a red cube on a table", negative_prompt="", seed=11, steps=3),
            call={"true_cfg_scale": 4.0, "negative_prompt": ""},
            differs=({"true_cfg_scale": 1.0},),
            tolerance=0,
        ),
        SampleCase(
            prompt=dict(prompt="a blue sphere", scale=1.0, seed=4, steps=2, width=80),
            call={"true_cfg_scale": 1.0},
            tolerance=0,
        ),
    )


def reference_loss(pipe, batch, seed, shift=2.2) -> torch.Tensor:
    """The loss written out from the pipeline's parts and facts: the VAE's posterior of the
    one-frame clip normalised per channel ((z - latents_mean) / latents_std), noisy = (1 - sigma)
    x0 + sigma noise, packed into 2x2 patches by the pipeline's _pack_latents, the transformer at
    sigma on the pipeline's prompt embeddings and mask, target noise - x0; the trainer's keyed
    draws and musubi-tuner's "shift" sigma draw."""
    x0, d, sigma = shifted_clip(pipe.vae, batch, seed, shift)
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    b, c, _, h, w = noisy.shape
    states, mask = pipe.encode_prompt(list(batch["captions"]), device=torch.device("cpu"))
    packed = pipe._pack_latents(noisy.transpose(1, 2), b, c, h, w)
    out = pipe.transformer(hidden_states=packed, timestep=sigma, encoder_hidden_states=states,
                           encoder_hidden_states_mask=mask, img_shapes=[[(1, h // 2, w // 2)]] * b,
                           return_dict=False)[0]  # fmt: skip
    out = pipe._unpack_latents(out, h * 8, w * 8, 8)
    per_sample = ((out - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3, 4))
    return (per_sample * batch["loss_weights"]).mean()


def _loss_reference(pipe, batch, seed, case):
    return reference_loss(pipe, batch, seed, case.flow.get("discrete_flow_shift", 2.2))


# LoRA (musubi-tuner's targets) on images whose captions have four lengths: alone in a
# micro-batch each caption is its own length (no mask), in the batch of 4 they are padded to the
# longest with the mask of their lengths; both must train the same LoRA.
DISTRIBUTED = (
    DistributedMode(
        name="qwenimage-lora",
        keys={
            "network_module": "networks.lora_qwen_image",
            "network_train_unet_only": True,
            "bucket_reso_steps": 16,
        },
        ddp_options=("--gradient_checkpointing",),
        captions=FOUR_LENGTH_CAPTIONS,
        only=("diffusion_model.transformer_blocks.",),
    ),
)

KIT = ConformanceKit(
    variants=("qwenimage",),
    build=lambda variant, seed: build_tiny_qwenimage_components(seed),
    write_folder=lambda path, variant, seed: write_tiny_qwenimage_folder(path, seed),
    pipeline=lambda variant: "QwenImagePipeline",
    family=lambda variant, modules: qwenimage_family(),
    denoiser_inputs=_inputs,
    sample_cases=_sample_cases,
    loss_cases=lambda variant: (LossCase(), LossCase(flow={"discrete_flow_shift": 4.0})),
    loss_reference=_loss_reference,
    distributed=DISTRIBUTED,
    vae_names=NameTable(
        to_original=vae_to_original, from_original=vae_from_original, reference=_reference_vae
    ),
    write_single_files=lambda path, variant, seed: single_files(path, seed),
    skips={
        "denoiser_names": (
            "Qwen-Image's single files keep diffusers' module names (no name table of its own)"
        ),
        "lycoris_fused": (
            "Qwen-Image's LyCORIS files name each diffusers Linear; no fused original layer"
        ),
    },
)
