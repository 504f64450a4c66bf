"""Z-Image's kit for the family conformance suite (tests.kits.conformance_kit).

Turbo and Base are one architecture (their tiny models are the same modules; the folders differ
in the scheduler's shift, which the loader reads to tell them apart). What the suite's
properties cannot ask of Z-Image is said in ``skips``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from library.models.families.zimage import keys
from library.models.families.zimage.family import zimage_family
from library.models.families.zimage.shapes import SCHEDULER_SHIFT, VARIANTS
from library.training.noise import NoiseOptions, draw
from tests.kits.conformance_kit import (
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.zimage.tiny import (
    build_tiny_zimage_components,
    write_tiny_zimage_folder,
)
from tests.kits.zimage.tiny_files import write_tiny_zimage_files


def _reference_transformer(original, config):
    """diffusers' converter (on the keys as they are inside a full checkpoint), which pops every
    key it reads: none may be left."""
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers,
    )

    checkpoint = {keys.CHECKPOINT_PREFIX + k: v for k, v in original.items()}
    converted = convert_z_image_transformer_checkpoint_to_diffusers(checkpoint)
    assert checkpoint == {}, f"diffusers left {sorted(checkpoint)[:5]}"
    return converted


def _family(variant, modules):

    return zimage_family(variant, SCHEDULER_SHIFT[variant])


def _inputs(transformer, seed):
    """One image (a one-frame 8 x 8 latent) and one caption of 7 tokens, as lists: the
    transformer takes one tensor per image and per caption."""
    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": [torch.randn(config.in_channels, 1, 8, 8, generator=gen)],
        "t": torch.tensor([0.3]),
        "cap_feats": [torch.randn(7, config.cap_feat_dim, generator=gen)],
    }


def _single_files(path, variant, seed):
    """Comfy-Org's transformer, Qwen3 (qwen_3_4b) and AE files, with the tokenizer folder."""
    files = write_tiny_zimage_files(path, variant, seed, dtype=torch.float32)
    model = {"pretrained_model_name_or_path": str(files["transformer"]),
             "tokenizer_path": str(files["tokenizer"]), "vae": str(files["ae"])}  # fmt: skip
    return model, {"text_encoder": str(files["text_encoder"])}


def _sample_cases(variant):
    """Turbo's default without guidance, and a guided prompt with a negative prompt (the usual
    CFG scale 3 is the pipeline's pos + 2 * (pos - neg)); Base's default CFG scale 4."""
    turbo = dict(prompt="a red cube on a table", seed=11, steps=3)
    if variant == "base":
        return (SampleCase(prompt=turbo, call={"guidance_scale": 3.0, "negative_prompt": ""},
                           differs=({"guidance_scale": 0.0},), tolerance=0),)  # fmt: skip
    return (
        SampleCase(prompt=turbo, call={"guidance_scale": 0.0}, tolerance=0),
        SampleCase(
            prompt=dict(
                prompt="a red cube on a table",
                scale=3.0,
                negative_prompt="blurry, dark",
                seed=4,
                steps=2,
                width=80,
            ),
            call={"guidance_scale": 2.0, "negative_prompt": "blurry, dark"},
            differs=({"guidance_scale": 0.0, "negative_prompt": None},),
            tolerance=0,
        ),  # fmt: skip
    )


def reference_loss(pipe, batch, seed, shift=2.0) -> torch.Tensor:
    """The loss written out from the pipeline's parts and facts (noisy = (1 - sigma) x0 +
    sigma noise, the transformer at 1 - sigma, target x0 - noise), with the trainer's keyed
    draws (the posterior sample's eps, the noise, the sigma draw z) and musubi-tuner's "shift"
    sigma draw."""
    posterior = pipe.vae.encode(batch["pixel_values"]).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(seed, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    z = posterior.mean + posterior.std * d.latent_eps
    x0 = (z - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    u = torch.sigmoid(d.time_normal)
    sigma = shift * u / (1 + (shift - 1) * u)
    s = sigma.view(-1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    states, _ = pipe.encode_prompt(batch["captions"], do_classifier_free_guidance=False)
    timestep = (1000 - sigma * 1000) / 1000  # as the pipeline computes it from the scheduler's
    out = pipe.transformer(list(noisy.unsqueeze(2).unbind(0)), timestep, states,
                           return_dict=False)[0]  # fmt: skip
    out = torch.stack(out).squeeze(2)
    per_sample = ((out - (x0 - d.noise)) ** 2).mean(dim=(1, 2, 3))
    return (per_sample * batch["loss_weights"]).mean()


def _loss_reference(pipe, batch, seed, case):
    return reference_loss(pipe, batch, seed, case.flow.get("discrete_flow_shift", 2.0))


# The distributed mode's captions, one per image: 21, 42, 73 and 151 tokens with Qwen3's chat
# template, so the transformer pads them to 32, 64, 96 and 160.
CAPTIONS = (
    "red",
    "a photo of shape number 1",
    "a photo of shape number 2 on a gradient, centred in the frame",
    "a much longer caption of shape number three, a coloured square on a soft gradient of warm "
    "and cool tones, photographed from above in even daylight",
)
# LoRA (musubi-tuner's targets) on images whose captions have four lengths: alone in a
# micro-batch each caption is its own length, in the batch of 4 it is padded to the longest
# (TextConditioning.lengths cut it back); both must train the same LoRA. Its state of step 1
# resumes to the same weights. Then the same with the transformer sharded (FSDP2: each block and
# the rest, the pad tokens among it, split over the processes), and the Qwen3 text encoder
# sharded too while it fills the text cache (fsdp_text_encoder; one process has nothing to
# shard with, so the reference fills it whole), the sharded copies encoding the sample prompts
# drawn before the first step.
_LORA = DistributedMode(
    name="zimage-lora",
    keys={
        "network_module": "networks.lora_zimage",
        "network_train_unet_only": True,
        "bucket_reso_steps": 16,
    },
    ddp_options=("--gradient_checkpointing",),
    captions=CAPTIONS,
    only=("diffusion_model.layers.",),  # the transformer's joint blocks, in Z-Image's own names
    resume=True,
)
DISTRIBUTED = (
    _LORA,
    replace(
        _LORA.sharding("zimage-fsdp"),
        keys={**_LORA.keys, "fsdp": "full_shard", "cache_text_encoder_outputs": True,
              "fsdp_text_encoder": True},
        samples=True,
    ),
)  # fmt: skip


KIT = ConformanceKit(
    variants=VARIANTS,
    build=lambda variant, seed: build_tiny_zimage_components(seed),
    write_folder=write_tiny_zimage_folder,
    pipeline=lambda variant: "ZImagePipeline",
    family=_family,
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: keys.diffusers_to_original(state),
        from_original=lambda original, config: keys.original_to_diffusers(original),
        reference=_reference_transformer,
    ),
    write_single_files=_single_files,
    sample_cases=_sample_cases,
    loss_cases=lambda variant: (LossCase(), LossCase(flow={"discrete_flow_shift": 4.0})),
    loss_reference=_loss_reference,
    distributed=DISTRIBUTED,
    skips={
        "vae_names": (
            "Z-Image's VAE is FLUX.1's AE, read from the folder's vae/ in diffusers' names; "
            "FLUX.1's kit checks that AE's original-layout name table"
        ),
        "lycoris_fused": (
            "Z-Image's LyCORIS files name each diffusers Linear (to_q, to_k, to_v apart), no "
            "fused original layer; ComfyUI's merge of them into the original qkv is checked in "
            "tests/models/zimage/test_zimage_comfy_keys.py"
        ),
    },
)
