"""diffusers' SDXL ``load_lora_weights`` consumes every key of our SDXL files and reproduces them.

diffusers converts kohya's SDXL names (SGM UNet layout, lora_te1_/lora_te2_) the way A1111 and
ComfyUI read them, so this is the compatibility check we can run offline.
"""

from __future__ import annotations

import copy

import pytest
import torch

from library.networks.kohya_keys import export_lora
from library.networks.lora import LoraSpec, apply_lora, lora_layers, randomize_lora
from library.saving.lora_file import save_lora_file
from tests.networks.lora_load_helpers import load_quietly, peft_layers

# Linear and conv (LoCon) layers of the UNet and both text encoders in one file; the SD 1.x
# test covers the other network settings.
CASES = {"locon+te": LoraSpec(4, 1.0, conv_dim=2, conv_alpha=2.0)}


@pytest.fixture(scope="module")
def sdxl_dir(tiny_sdxl_model_dir):
    return tiny_sdxl_model_dir


def _images(pipe) -> torch.Tensor:
    # No classifier-free guidance: half the UNet calls, the same check.
    out = pipe(
        "a photo",
        num_inference_steps=2,
        guidance_scale=1.0,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    return torch.from_numpy(out.images)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sdxl_pipeline_loads_every_key(case, sdxl_dir, tmp_path):
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_dir)
    plain_images = _images(pipe)
    models = {
        "lora_unet": copy.deepcopy(pipe.unet),
        "lora_te1": copy.deepcopy(pipe.text_encoder),
        "lora_te2": copy.deepcopy(pipe.text_encoder_2),
    }
    gen = torch.Generator().manual_seed(7)
    for prefix, model in models.items():
        apply_lora(model, "unet" if prefix == "lora_unet" else "text_encoder", CASES[case])
        randomize_lora(model, gen, std=0.1)
    path = tmp_path / f"{case}.safetensors"
    tensors = export_lora(models)
    assert any(k.startswith("lora_unet_input_blocks_") for k in tensors)  # SGM names
    save_lora_file(path, tensors, {}, torch.float32)

    noise = load_quietly(pipe, path)
    assert not noise, noise  # e.g. "unexpected keys not found in the model"

    # Every module of the file became an adapter on the module we adapted.
    assert sorted(peft_layers(pipe.unet)) == sorted(lora_layers(models["lora_unet"]))
    assert len(peft_layers(pipe.text_encoder)) == 2 * 6
    assert len(peft_layers(pipe.text_encoder_2)) == 3 * 6
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(2, 4, 8, 8, generator=gen)
    context = torch.randn(2, 77, 80, generator=gen)
    added = {
        "text_embeds": torch.randn(2, 24, generator=gen),
        "time_ids": torch.tensor([[64.0, 64, 0, 0, 64, 64]] * 2),
    }
    with torch.no_grad():
        theirs = pipe.unet(latents, torch.tensor([3, 600]), context, added_cond_kwargs=added)
        ours = models["lora_unet"](
            latents, torch.tensor([3, 600]), context, added_cond_kwargs=added
        )
        torch.testing.assert_close(theirs.sample, ours.sample, rtol=1e-4, atol=1e-5)
        ids = torch.randint(0, 500, (2, 77), generator=gen)
        for name, prefix in (("text_encoder", "lora_te1"), ("text_encoder_2", "lora_te2")):
            mine = models[prefix](ids, output_hidden_states=True)
            loaded = getattr(pipe, name)(ids, output_hidden_states=True)
            torch.testing.assert_close(loaded.hidden_states[-2], mine.hidden_states[-2])
        torch.testing.assert_close(
            pipe.text_encoder_2(ids).text_embeds, models["lora_te2"](ids).text_embeds
        )
    assert (_images(pipe) - plain_images).abs().max() > 1e-3
