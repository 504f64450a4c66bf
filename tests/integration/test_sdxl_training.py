"""SDXL end to end on the tiny SDXL model: the loss, LoRA (UNet + both text encoders) and full-UNet
training through the CLI, and what the saved files hold."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from library.config.schema import ModelSection
from library.models.families.sd.family import SDXL
from library.models.loader import load_components
from library.training.noise import draw
from tests.integration.harness import make_images, tensors, train, write_config

UNET_MODULES, TE1_MODULES, TE2_MODULES = 132, 2 * 6, 3 * 6  # see tests/networks/test_sdxl_*


@pytest.fixture(scope="module")
def sdxl_dir(tiny_sdxl_model_dir):
    return tiny_sdxl_model_dir


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 3)


def _components(path, tokenizers=None):
    model = ModelSection(
        pretrained_model_name_or_path=str(path),
        tokenizer_path=str(tokenizers) if tokenizers else None,
    )
    return load_components(model, torch.float32)


def _alpha_bar(steps):
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, 0)[steps].float().view(-1, 1, 1, 1)


def test_sdxl_step_loss_matches_reference(sdxl_dir):
    """micro_batch_loss with SDXL conditioning against the loss written out by hand, with the
    prompt embeddings from diffusers' SDXL pipeline."""
    from diffusers import StableDiffusionXLPipeline

    from library.training.step import StepInputs, micro_batch_loss

    c = _components(sdxl_dir)
    torch.manual_seed(3)
    batch = {
        "pixel_values": torch.rand(2, 3, 64, 64) * 2 - 1,
        "captions": ["a red circle", "shape"],
        "loss_weights": torch.tensor([1.0, 0.5]),
        "positions": torch.tensor([4, 0]),
        "epoch": 1,
        "original_sizes": torch.tensor([[480, 640], [64, 64]]),
        "crop_top_lefts": torch.tensor([[0, 32], [0, 0]]),
        "target_sizes": torch.tensor([[64, 64], [64, 64]]),
    }
    inputs = StepInputs(
        denoiser=c.denoiser,
        vae=c.vae,
        family=c.family,
        objective=c.objective,
        text_encoders=c.text_encoders,
        tokenizers=c.tokenizers,
        train_text_encoder=False,
        weight_dtype=torch.float32,
        device=torch.device("cpu"),
        seed=11,
    )
    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_dir)
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
        posterior = c.vae.encode(batch["pixel_values"]).latent_dist
        d = draw(11, 1, [4, 0], tuple(posterior.mean.shape[1:]), 1000, torch.device("cpu"))
        x0 = (posterior.mean + posterior.std * d.latent_eps) * 0.13025  # SDXL's latent scale
        a = _alpha_bar(d.timesteps)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * d.noise
        embeds, _, pooled, _ = pipe.encode_prompt(
            batch["captions"], device="cpu", do_classifier_free_guidance=False
        )
        time_ids = torch.tensor([[480.0, 640, 0, 32, 64, 64], [64, 64, 0, 0, 64, 64]])
        added = {"text_embeds": pooled, "time_ids": time_ids}
        pred = c.denoiser(xt, d.timesteps, embeds, added_cond_kwargs=added).sample
        per_sample = ((pred - d.noise) ** 2).mean(dim=(1, 2, 3))
        expected = (per_sample * batch["loss_weights"]).mean()
        moved = micro_batch_loss(inputs, {**batch, "crop_top_lefts": torch.zeros(2, 2)})
    assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-7), (ours.item(), expected.item())
    assert not torch.allclose(ours, moved)  # the crop offsets reach the loss


def test_setup_trains_both_text_encoders(sdxl_dir):
    from library.config.loader import load_config
    from library.training.setup import setup_training

    c = _components(sdxl_dir)
    config_file = sdxl_dir.parent / "setup.toml"
    write_config(config_file, sdxl_dir, sdxl_dir, sdxl_dir.parent / "o", text_encoder_lr=5e-5)
    parts = setup_training(load_config(str(config_file), []), c)
    assert [g["name"] for g in parts.param_groups] == ["unet", "text_encoder", "text_encoder_2"]
    assert [g["lr"] for g in parts.param_groups] == [1e-3, 5e-5, 5e-5]
    # Down and up weight per adapted layer; the first encoder's last layer is not trained (its
    # output never reaches the UNet), the second encoder's every layer is (it gives the pooled).
    sizes = [len(g["params"]) for g in parts.param_groups]
    assert sizes == [2 * UNET_MODULES, 2 * (TE1_MODULES - 6), 2 * TE2_MODULES]
    models = parts.lora_models()
    assert list(models) == ["lora_unet", "lora_te1", "lora_te2"]
    assert models["lora_te2"] is c.text_encoders[1]
    assert [name for name, _ in parts.trained_modules()] == [
        "unet",
        "text_encoder",
        "text_encoder_2",
    ]
    assert any(k.startswith("text_encoder_2.") for k in parts.trained_weights())


def _modules(keys, prefix):
    return {k.split(".", 1)[0] for k in keys if k.startswith(prefix + "_")}


def test_sdxl_lora_trains_and_loads_in_diffusers(tmp_path, sdxl_dir, images):
    from diffusers import StableDiffusionXLPipeline

    config = write_config(
        tmp_path / "c.toml",
        sdxl_dir,
        images,
        tmp_path / "out",
        max_train_steps=2,
        learning_rate=1e-2,
    )
    assert train(config) == 0
    path = tmp_path / "out" / "run.safetensors"
    saved = tensors(path)
    unet, te1, te2 = (_modules(saved, p) for p in ("lora_unet", "lora_te1", "lora_te2"))
    assert (len(unet), len(te1), len(te2)) == (UNET_MODULES, TE1_MODULES, TE2_MODULES)
    assert len(saved) == 3 * (UNET_MODULES + TE1_MODULES + TE2_MODULES)
    sgm = ("lora_unet_input_blocks_", "lora_unet_middle_block_", "lora_unet_output_blocks_")
    assert all(name.startswith(sgm) for name in unet)
    # Training moved the up weights (they start at zero) of the UNet and both encoders.
    for prefix in ("lora_unet", "lora_te1", "lora_te2"):
        ups = [v for k, v in saved.items() if k.startswith(prefix) and k.endswith("lora_up.weight")]
        assert any(v.abs().max() > 0 for v in ups), prefix
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["ss_base_model_version"] == "sdxl_base_v1-0"
    assert meta["modelspec.architecture"] == "stable-diffusion-xl-v1-base/lora"
    assert meta["ss_v2"] == "False"
    assert json.loads(meta["ss_network_args"]) == {}

    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_dir)
    pipe.load_lora_weights(str(path))
    from peft.tuners.tuners_utils import BaseTunerLayer

    def adapted(model):
        return sum(isinstance(m, BaseTunerLayer) for m in model.modules())

    counts = (adapted(pipe.unet), adapted(pipe.text_encoder), adapted(pipe.text_encoder_2))
    assert counts == (UNET_MODULES, TE1_MODULES, TE2_MODULES)


def test_sdxl_full_unet_trains(tmp_path, sdxl_dir, images):
    config = write_config(
        tmp_path / "c.toml",
        sdxl_dir,
        images,
        tmp_path / "out",
        max_train_steps=2,
        train_mode="unet",
        learning_rate=1e-3,
    )
    assert train(config) == 0
    folder = tmp_path / "out" / "run"
    again = _components(folder)
    assert again.family is SDXL and len(again.text_encoders) == 2
    saved = again.denoiser.state_dict()
    base = _components(sdxl_dir).denoiser.state_dict()
    assert saved.keys() == base.keys()
    changed = [k for k in base if not torch.equal(saved[k], base[k])]
    assert any(k.startswith("add_embedding.") for k in changed)  # the size/pooled path trained
    assert any("attn2.to_k" in k for k in changed)
    # the single file is an SGM-layout SDXL checkpoint holding the same UNet
    single = _components(tmp_path / "out" / "run.safetensors", tokenizers=sdxl_dir)
    assert single.family is SDXL
    for key, value in single.denoiser.state_dict().items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=0)
    with safe_open(str(tmp_path / "out" / "run.safetensors"), framework="pt") as f:
        assert f.metadata()["modelspec.architecture"] == "stable-diffusion-xl-v1-base"


def test_sdxl_buckets_with_both_caches_train_like_no_cache(tmp_path, sdxl_dir):
    """SDXL's size conditioning and pooled embedding come through the caches unchanged."""
    from PIL import Image

    folder = tmp_path / "mixed"
    folder.mkdir()
    for i, size in enumerate([(64, 96), (96, 64), (80, 80), (70, 100)]):
        Image.new("RGB", size, (50 * i, 120, 200 - 40 * i)).save(folder / f"m{i}.png")
        (folder / f"m{i}.txt").write_text(f"mixed shape {i}")
    keys = dict(
        resolution=96, enable_bucket=True, min_bucket_reso=64, max_bucket_reso=128,
        bucket_reso_steps=32, flip_aug=True, network_train_unet_only=True, train_batch_size=2,
        max_train_steps=2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    plain = write_config(tmp_path / "p.toml", sdxl_dir, folder, tmp_path / "p", **keys)
    cached = write_config(
        tmp_path / "c.toml", sdxl_dir, folder, tmp_path / "c", cache_latents_to_disk=True,
        cache_text_encoder_outputs_to_disk=True, **keys,
    )  # fmt: skip
    assert train(plain) == 0 and train(cached) == 0
    a, b = tensors(tmp_path / "p" / "run.safetensors"), tensors(tmp_path / "c" / "run.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 5e-5
    ups = [v for k, v in a.items() if k.endswith("lora_up.weight")]
    assert max(v.abs().max().item() for v in ups) > 1e-4  # the steps moved the weights
