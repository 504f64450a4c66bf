"""diffusers' ``load_lora_weights`` consumes every key of our files and reproduces our adapter.

A1111/Forge and ComfyUI read the same kohya names, so this is the compatibility check we can run
offline.
"""

from __future__ import annotations

import copy

import pytest
import torch

from library.models.families.registry import unet_key_layout
from library.networks.kohya_keys import export_lora
from library.networks.lora import LoraSpec, apply_lora, lora_layers, randomize_lora
from library.saving.lora_file import save_lora_file
from tests.networks.lora_load_helpers import load_quietly, peft_layers

CASES = {
    "unet": (LoraSpec(4, 1.0), False),
    "unet+te": (LoraSpec(4, 2.0), True),
    "conv": (LoraSpec(4, 1.0, conv_dim=2, conv_alpha=2.0), True),
    "sd2v": (LoraSpec(4, 1.0, conv_dim=2), True),  # linear proj_in/proj_out, v-prediction
}


def _pipeline(folder):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(folder, safety_checker=None)


def _images(pipe) -> torch.Tensor:
    out = pipe(
        "a photo",
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    return torch.from_numpy(out.images)


@pytest.mark.parametrize("case", sorted(CASES))
def test_diffusers_loads_every_key(case, request, tmp_path, unet_inputs, unet_out, token_ids):
    spec, with_te = CASES[case]
    folder = "tiny_sd2v_model_dir" if case == "sd2v" else "tiny_model_dir"
    pipe = _pipeline(request.getfixturevalue(folder))
    plain_images = _images(pipe)
    models = {"lora_unet": copy.deepcopy(pipe.unet)}
    if with_te:
        models["lora_te"] = copy.deepcopy(pipe.text_encoder)
    gen = torch.Generator().manual_seed(7)
    for prefix, model in models.items():
        apply_lora(model, "unet" if prefix == "lora_unet" else "text_encoder", spec)
        randomize_lora(model, gen, std=0.1)
    path = tmp_path / f"{case}.safetensors"
    save_lora_file(path, export_lora(models, unet_key_layout), {}, torch.float32)

    noise = load_quietly(pipe, path)
    if not with_te:  # diffusers notes that a UNet-only file has nothing for the text encoder
        noise = [m for m in noise if not m.startswith("No LoRA keys associated to CLIPTextModel")]
    assert not noise, noise  # e.g. "unexpected keys not found in the model"

    assert sorted(peft_layers(pipe.unet)) == sorted(lora_layers(models["lora_unet"]))
    assert len(peft_layers(pipe.text_encoder)) == (12 if with_te else 0)
    torch.testing.assert_close(
        unet_out(pipe.unet, unet_inputs),
        unet_out(models["lora_unet"], unet_inputs),
        rtol=1e-4,
        atol=1e-5,
    )
    if with_te:
        with torch.no_grad():
            theirs = pipe.text_encoder(token_ids)[0]
            ours = models["lora_te"](token_ids)[0]
        torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)
    assert (_images(pipe) - plain_images).abs().max() > 1e-3
