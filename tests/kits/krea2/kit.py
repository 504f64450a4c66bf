"""Krea 2's kit for the family conformance suite (ConformanceKit).

Two variants: RAW (the checkpoint trained on, guided sampling over the resolution-aware shift)
and Turbo (the distilled one: the pipeline's is_distilled, fixed mu = 1.15, no guidance). What
the suite's properties cannot ask of Krea 2 is said in ``skips``.
"""

from __future__ import annotations

import torch

from library.models.families.krea2.family import krea2_family
from library.models.families.krea2.keys import TABLE
from tests.kits.conformance_kit import (
    FOUR_LENGTH_CAPTIONS,
    ConformanceKit,
    DistributedMode,
    LossCase,
    NameTable,
    SampleCase,
)
from tests.kits.krea2.tiny import TAPS, build_tiny_krea2_components, write_tiny_krea2_folder
from tests.kits.krea2.tiny_files import write_tiny_krea2_files
from tests.kits.video_reference import shifted_clip

TEXT_TOKENS = 512  # the pipeline's fixed caption length (max_sequence_length), as our family's cap


def _inputs(transformer, seed):
    """One 8 x 8 latent packed into 16 tokens of 2x2 patches and one caption of 7 tokens."""
    from library.models.patch_tokens import grid_positions

    config = transformer.config
    gen = torch.Generator().manual_seed(seed)
    states = (1, 7, config.num_text_layers, config.text_hidden_dim)
    return {
        "hidden_states": torch.randn(1, 16, config.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(*states, generator=gen),
        "timestep": torch.tensor([0.3]),
        "position_ids": grid_positions(7, 4, 4),
        "encoder_attention_mask": torch.ones(1, 7, dtype=torch.bool),
    }


def single_files(path, variant, seed):
    """Krea's transformer file (ComfyUI's prefix for Turbo), Qwen3-VL's and the VAE's, with the
    tokenizer folder and, for Turbo, [flow] dit_variant."""
    files = write_tiny_krea2_files(path, seed, comfy=variant == "turbo")
    model = {"pretrained_model_name_or_path": str(files["transformer"]),
             "tokenizer_path": str(files["tokenizer"]), "vae": str(files["vae"])}  # fmt: skip
    flow = {"text_encoder": str(files["text_encoder"])}
    return model, {**flow, "dit_variant": "turbo"} if variant == "turbo" else flow


def _reference_names(original, config):
    """diffusers' single-file converter of Krea 2's original transformer layout."""
    from diffusers.loaders.single_file_utils import (
        convert_krea2_transformer_checkpoint_to_diffusers,
    )

    return convert_krea2_transformer_checkpoint_to_diffusers(dict(original))


def _sample_cases(variant):
    """RAW: the pipeline's guidance (4.5, our scale 5.5, with an empty negative prompt) and an
    unguided prompt at another size. Turbo: its default, no guidance."""
    if variant == "turbo":
        return (
            SampleCase(
                prompt=dict(prompt="a red cube on a table", seed=3, steps=3),
                call={"guidance_scale": 0.0},
                differs=({"guidance_scale": 40.0},),
                tolerance=1,
            ),
        )
    return (
        SampleCase(
            prompt=dict(prompt="a red cube on a table", negative_prompt="", seed=11, steps=3),
            call={"guidance_scale": 4.5, "negative_prompt": ""},
            differs=({"guidance_scale": 0.0},),
            tolerance=1,
        ),
        SampleCase(
            prompt=dict(prompt="a blue sphere", scale=1.0, seed=4, steps=2, width=80),
            call={"guidance_scale": 0.0},
            tolerance=1,
        ),
    )


def reference_loss(pipe, batch, seed, shift=2.5) -> torch.Tensor:
    """The loss written out from the pipeline's parts and facts: the VAE's posterior of the
    one-frame clip normalised per channel ((z - latents_mean) / latents_std), noisy = (1 - sigma)
    x0 + sigma noise, packed by the pipeline's _pack_latents with its prepare_position_ids, the
    transformer at sigma on the pipeline's prompt embeddings and mask (its fixed-length layout),
    target noise - x0; the trainer's keyed draws and musubi-tuner's "shift" sigma draw."""
    x0, d, sigma = shifted_clip(pipe.vae, batch, seed, shift)
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    b, c, _, h, w = noisy.shape
    states, mask = pipe.encode_prompt(list(batch["captions"]), device=torch.device("cpu"),
                                      max_sequence_length=TEXT_TOKENS)  # fmt: skip
    packed = pipe._pack_latents(noisy[:, :, 0], b, c, h, w)
    positions = pipe.prepare_position_ids(states.shape[1], h // 2, w // 2, torch.device("cpu"))
    out = pipe.transformer(hidden_states=packed, encoder_hidden_states=states, timestep=sigma,
                           position_ids=positions, encoder_attention_mask=mask,
                           return_dict=False)[0]  # fmt: skip
    out = pipe._unpack_latents(out, h * 8, w * 8)
    per_sample = ((out - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3, 4))
    return (per_sample * batch["loss_weights"]).mean()


def _loss_reference(pipe, batch, seed, case):
    return reference_loss(pipe, batch, seed, case.flow.get("discrete_flow_shift", 2.5))


# LoRA (musubi-tuner's targets: every Linear) on images whose captions have four lengths: alone
# in a micro-batch each caption is its own length, in the batch of 4 they are padded to the
# longest with the mask of their lengths; both must train the same LoRA, and a run resumed from
# its step-1 state must end on the same weights.
DISTRIBUTED = (
    DistributedMode(
        name="krea2-lora",
        keys={
            "network_module": "networks.lora_krea2",
            "network_train_unet_only": True,
            "bucket_reso_steps": 16,
        },
        ddp_options=("--gradient_checkpointing",),
        captions=FOUR_LENGTH_CAPTIONS,
        only=("diffusion_model.",),
        resume=True,
    ),
)

KIT = ConformanceKit(
    variants=("raw", "turbo"),
    build=lambda variant, seed: build_tiny_krea2_components(seed),
    write_folder=lambda path, variant, seed: write_tiny_krea2_folder(
        path, seed, distilled=variant == "turbo"
    ),
    pipeline=lambda variant: "Krea2Pipeline",
    family=lambda variant, modules: krea2_family(TAPS, distilled=variant == "turbo"),
    denoiser_inputs=_inputs,
    denoiser_names=NameTable(
        to_original=lambda state, config: TABLE.to_original(state),
        from_original=lambda original, config: TABLE.from_original(original),
        reference=_reference_names,
    ),  # fmt: skip
    sample_cases=_sample_cases,
    loss_cases=lambda variant: (LossCase(), LossCase(flow={"discrete_flow_shift": 4.0})),
    loss_reference=_loss_reference,
    distributed=DISTRIBUTED,
    write_single_files=single_files,
    skips={
        "vae_names": "Krea 2's VAE file is Qwen-Image's (its name table is checked there)",
        "lycoris_fused": "Krea 2's LyCORIS files name each Linear; no fused original layer",
    },
)
