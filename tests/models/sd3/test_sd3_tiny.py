"""Tiny SD3 / SD3.5 components and their files: seeding, one pass through the whole chain
(tokenizers -> three text encoders -> transformer; VAE both ways), diffusers reading the folder,
and the single files holding the same weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from library.models.families.sd3 import original_keys as keys
from library.models.families.sd3 import shapes
from tests.kits.sd3 import tiny_shapes
from tests.kits.sd3.tiny import build_tiny_sd3_components
from tests.kits.sd3.tiny_files import (
    tiny_configs,
    write_tiny_sd3_files,
    write_tiny_sd3_folder,
)


def test_components_are_seeded():
    first = build_tiny_sd3_components("sd3.5-medium", seed=5)
    second = build_tiny_sd3_components("sd3.5-medium", seed=5)
    other = build_tiny_sd3_components("sd3.5-medium", seed=6)
    assert list(first) == ["transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"]
    for name, module in first.items():
        state, again = module.state_dict(), second[name].state_dict()
        assert all(torch.equal(state[k], again[k]) for k in state), name
        differs = [not torch.equal(v, other[name].state_dict()[k]) for k, v in state.items()]
        assert any(differs), name


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_tiny_chain(variant, tmp_path):
    """SD3's conditioning from the tiny encoders fits the tiny transformer: the CLIPs' penultimate
    states side by side, padded to T5's width and followed by T5's states; the two projected
    pooled outputs side by side."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    from tests.kits.flux.tiny import write_tiny_t5_tokenizer
    from tests.kits.sd.tiny import write_tiny_tokenizer

    parts = build_tiny_sd3_components(variant)
    clip_tok = CLIPTokenizer.from_pretrained(write_tiny_tokenizer(tmp_path / "clip"))
    t5_tok = T5TokenizerFast.from_pretrained(write_tiny_t5_tokenizer(tmp_path / "t5"))
    prompt = ["a cat"]
    clip_ids = clip_tok(prompt, padding="max_length", max_length=77, return_tensors="pt")
    t5_ids = t5_tok(prompt, padding="max_length", max_length=16, return_tensors="pt")
    image = torch.rand(1, 3, tiny_shapes.TINY_SIZE, tiny_shapes.TINY_SIZE) * 2 - 1
    with torch.no_grad():
        clip_out = [
            parts[name](clip_ids.input_ids, output_hidden_states=True)
            for name in ("text_encoder", "text_encoder_2")
        ]
        clip_states = torch.cat([out.hidden_states[-2] for out in clip_out], dim=-1)
        pooled = torch.cat([out.text_embeds for out in clip_out], dim=-1)
        t5_states = parts["text_encoder_3"](**t5_ids).last_hidden_state
        padded = torch.nn.functional.pad(
            clip_states, (0, tiny_shapes.TINY_T5_WIDTH - clip_states.shape[-1])
        )
        context = torch.cat([padded, t5_states], dim=1)
        latents = parts["vae"].encode(image).latent_dist.mean
        assert latents.shape == (1, shapes.LATENT_CHANNELS, 8, 8)
        out = parts["transformer"](
            hidden_states=latents,
            encoder_hidden_states=context,
            pooled_projections=pooled,
            timestep=torch.tensor([500.0]),
        ).sample
        decoded = parts["vae"].decode(latents).sample
    assert pooled.shape == (1, tiny_shapes.TINY_CLIP_L_WIDTH + tiny_shapes.TINY_CLIP_G_WIDTH)
    assert context.shape == (1, 77 + 16, tiny_shapes.TINY_T5_WIDTH)
    assert out.shape == latents.shape and decoded.shape == image.shape
    assert torch.isfinite(out).all() and torch.isfinite(decoded).all()


@pytest.mark.parametrize("variant", shapes.VARIANTS)
def test_folder_is_read_by_diffusers(variant, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    folder = write_tiny_sd3_folder(tmp_path / "tiny-sd3", variant, seed=2)
    pipe = StableDiffusion3Pipeline.from_pretrained(str(folder), local_files_only=True)
    built = build_tiny_sd3_components(variant, seed=2)
    for name, module in built.items():
        loaded = getattr(pipe, name).state_dict()
        want = module.state_dict()
        assert set(loaded) == set(want), name
        assert all(torch.equal(loaded[k], want[k]) for k in want), name
    assert pipe.scheduler.config.shift == 3.0
    assert pipe.transformer.config.qk_norm == shapes.QK_NORM[variant]
    image = pipe(
        "a cat", num_inference_steps=1, height=64, width=64, output_type="pt",
        max_sequence_length=16,
    ).images  # fmt: skip
    assert image.shape == (1, 3, 64, 64) and torch.isfinite(image).all()


@pytest.mark.parametrize("inside", [True, False], ids=["inside", "separate"])
def test_single_files_hold_the_components(tmp_path, inside):
    variant = "sd3.5-medium"
    files = write_tiny_sd3_files(tmp_path, variant, 1, text_encoders_inside=inside)
    name = "sd3.5_medium_incl_clips_t5xxl" if inside else "sd3.5_medium"
    assert files["model"].name == f"{name}.safetensors"
    assert ("clip_l" in files) == (not inside)
    built = build_tiny_sd3_components(variant, 1)
    model = load_file(str(files["model"]))
    assert keys.detect_sd3(model) == ("original", keys.ORIGINAL_PREFIX)
    encoders = keys.TEXT_ENCODER_PREFIXES.values()
    holds = {p: any(k.startswith(p) for k in model) for p in (keys.VAE_PREFIX, *encoders)}
    assert holds == {keys.VAE_PREFIX: True, **dict.fromkeys(encoders, inside)}
    mmdit = {k: v for k, v in model.items() if k.startswith(keys.ORIGINAL_PREFIX)}
    vae = {k[len(keys.VAE_PREFIX) :]: v for k, v in model.items() if k.startswith(keys.VAE_PREFIX)}
    states = {
        "transformer": keys.transformer_from_original(mmdit),
        "vae": keys.ae_from_original(vae),
    }

    def text_encoder(key: str) -> dict[str, torch.Tensor]:
        """The encoder's tensors: from inside the model file, else from its own file."""
        if not inside:
            return load_file(str(files[key]))
        prefix = keys.TEXT_ENCODER_PREFIXES[key]
        return {k[len(prefix) :]: v for k, v in model.items() if k.startswith(prefix)}

    states["text_encoder"] = text_encoder("clip_l")
    states["text_encoder_2"] = text_encoder("clip_g")
    t5 = text_encoder("t5xxl")
    assert set(t5) == set(built["text_encoder_3"].state_dict()) - {"encoder.embed_tokens.weight"}
    states["text_encoder_3"] = {**t5, "encoder.embed_tokens.weight": t5["shared.weight"]}
    for part, state in states.items():
        want = built[part].state_dict()
        assert set(state) == set(want), part
        for k, v in want.items():
            assert state[k].dtype == torch.bfloat16
            assert torch.equal(state[k], v.to(torch.bfloat16)), (part, k)
    # Every part's exact config is in the header of the file that holds it.
    configs = tiny_configs(variant)
    holders = {
        "transformer": "model",
        "vae": "model",
        "text_encoder": "clip_l",
        "text_encoder_2": "clip_g",
        "text_encoder_3": "t5xxl",
    }
    for part, holder in holders.items():
        with safe_open(str(files["model" if inside else holder]), "pt") as handle:
            stored = json.loads(handle.metadata()["difftune.config." + part])
        assert stored == json.loads(json.dumps(configs[part])), part


def test_fp8_files_mix_storage_dtypes(tmp_path):
    files = write_tiny_sd3_files(tmp_path, "sd3-medium", 0, text_encoders_inside=True, fp8=True)
    with safe_open(str(files["model"]), "pt") as handle:
        stored = {k: handle.get_slice(k).get_dtype() for k in handle.keys()}  # noqa: SIM118
    fp8 = {k for k, v in stored.items() if v == "F8_E4M3"}
    assert fp8 and all(
        k.startswith((keys.ORIGINAL_PREFIX, keys.TEXT_ENCODER_PREFIXES["t5xxl"])) for k in fp8
    )
    assert stored[keys.ORIGINAL_PREFIX + "x_embedder.proj.bias"] == "BF16"
    assert all(v == "BF16" for k, v in stored.items() if k.startswith(keys.VAE_PREFIX))
