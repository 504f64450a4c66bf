"""Z-Image end to end through the CLI on the tiny ZImagePipeline folder: a LoRA trains for two
steps, its first step's loss equals the loss written out from diffusers' pipeline and the
model's facts, and the saved file is what diffusers' ZImagePipeline.load_lora_weights applies
exactly (after fuse_lora: base + alpha / r * up @ down of the file's factors)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from library.training.noise import NoiseOptions, draw
from tests.integration.harness import make_images, tensors, train, write_config

ZIMAGE = {
    "network_module": "networks.lora_zimage",
    "network_train_unet_only": True,
    "bucket_reso_steps": 16,
    "max_train_steps": 2,
    "train_batch_size": 2,
}
SEED = 7  # write_config's


@pytest.fixture(scope="module")
def zimage_dir(kit_folders):
    """The session's tiny kit folder (zimage turbo, seed 0): read only."""
    return kit_folders("zimage", "turbo")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = make_images(tmp_path_factory.mktemp("data") / "imgs", 2, size=64)
    # captions of different lengths: each keeps its own in the conditioning and the text cache
    (folder / "img01.txt").write_text("a much longer caption of shape number one on a gradient")
    return folder


@pytest.fixture(scope="module")
def pipe(zimage_dir):
    from diffusers import ZImagePipeline

    return ZImagePipeline.from_pretrained(zimage_dir, local_files_only=True)


@torch.no_grad()
def reference_loss(pipe, batch) -> torch.Tensor:
    """The pipeline's facts written out with the trainer's keyed draws: x0 from the VAE
    posterior, sigma = shift(sigmoid(z), 2), noisy = (1 - sigma) x0 + sigma noise, the
    transformer at (1000 - 1000 sigma) / 1000 on the pipeline's caption states, target
    x0 - noise, mean squared error times each sample's loss weight."""
    posterior = pipe.vae.encode(batch["pixel_values"].float()).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(SEED, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    z = posterior.mean + posterior.std * d.latent_eps
    x0 = (z - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    u = torch.sigmoid(d.time_normal)
    sigma = 2.0 * u / (1 + u)
    s = sigma.view(-1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    states, _ = pipe.encode_prompt(list(batch["captions"]), do_classifier_free_guidance=False)
    out = pipe.transformer(list(noisy.unsqueeze(2).unbind(0)), (1000 - sigma * 1000) / 1000,
                           states, return_dict=False)[0]  # fmt: skip
    per_sample = ((torch.stack(out).squeeze(2) - (x0 - d.noise)) ** 2).mean(dim=(1, 2, 3))
    return (per_sample * batch["loss_weights"].float()).mean()


def test_lora_trains_and_diffusers_applies_the_file(tmp_path, zimage_dir, images, pipe,
                                                    monkeypatch):  # fmt: skip
    from library.training import trainer

    first: list = []
    real = trainer.micro_batch_loss

    def recording(inputs, batch):
        loss = real(inputs, batch)
        if not first:
            first.append(({k: v for k, v in batch.items()}, loss.detach()))
        return loss

    monkeypatch.setattr(trainer, "micro_batch_loss", recording)
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", zimage_dir, images, out, **ZIMAGE)
    assert train(config) == 0

    batch, loss = first[0]
    assert len(batch["captions"]) == 2
    torch.testing.assert_close(loss, reference_loss(pipe, batch), rtol=1e-5, atol=0)

    path = out / "run.safetensors"
    saved = tensors(path)
    modules = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0]
               for k in saved}  # fmt: skip
    assert len(modules) == 2 * 7  # musubi-tuner's targets of the 2 tiny joint blocks
    assert "diffusion_model.layers.1.attention.to_q" in modules
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_up.weight"))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "networks.lora_zimage"
    assert meta["ss_base_model_version"] == "z_image"
    assert meta["modelspec.architecture"] == "Z-Image/lora"
    assert meta["ss_timestep_sampling"] == "shift" and meta["ss_discrete_flow_shift"] == "2.0"

    model = pipe.transformer
    base = {m: model.get_submodule(m[len("diffusion_model.") :]).weight.detach().clone()
            for m in modules}  # fmt: skip
    pipe.load_lora_weights(str(path))
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0)
    for module in sorted(modules):
        down, up = saved[f"{module}.lora_down.weight"], saved[f"{module}.lora_up.weight"]
        alpha = saved[f"{module}.alpha"].item()
        expected = base[module] + alpha / down.shape[0] * (up.float() @ down.float())
        layer = model.get_submodule(module[len("diffusion_model.") :])
        fused = getattr(layer, "base_layer", layer).weight.detach()
        torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6, msg=module)


def test_cached_text_and_latents_train_the_same_lora(tmp_path, zimage_dir, images):
    """The text cache holds each caption at its own length (on disk too) and the latent cache
    the posterior, so a cached run trains the LoRA an uncached one does (up to the VAE's
    batch-size rounding, as SDXL's test allows)."""
    runs = {}
    caches = {"cache_latents_to_disk": True, "cache_text_encoder_outputs_to_disk": True}
    caches["cache_dir"] = str(tmp_path / "cache")
    for name, keys in (("plain", {}), ("cached", caches)):
        (tmp_path / name).mkdir()
        config = write_config(tmp_path / name / "c.toml", zimage_dir, images,
                              tmp_path / name / "out", **ZIMAGE, **keys)  # fmt: skip
        assert train(config) == 0
        runs[name] = tensors(tmp_path / name / "out" / "run.safetensors")
    a, b = runs["plain"], runs["cached"]
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 5e-5
    lengths = set()
    for file in (tmp_path / "cache" / "text").glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            lengths.add(f.get_tensor("hidden").shape[0])
    assert len(lengths) == 2  # each caption stored at its own length


def test_full_fine_tune_writes_the_trained_transformer_in_the_original_layout(
    tmp_path, zimage_dir, images, pipe, monkeypatch
):
    """train_mode = "unet": the transformer alone in the original names (what ComfyUI loads),
    which diffusers' single-file converter turns back into exactly the trained transformer's
    state dict; the base being a folder, a diffusers folder holds the same weights."""
    from diffusers import ZImageTransformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers,
    )

    from library.models.families.zimage.family import ZImageFamily

    trained = {}
    real = ZImageFamily.write_full_model

    def recording(self, path, denoiser, *args):
        trained.update({k: v.detach().clone() for k, v in denoiser.state_dict().items()})
        return real(self, path, denoiser, *args)

    monkeypatch.setattr(ZImageFamily, "write_full_model", recording)
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", zimage_dir, images, out, train_mode="unet",
                          learning_rate=1e-4, save_precision="float", bucket_reso_steps=16,
                          max_train_steps=2)  # fmt: skip
    assert train(config) == 0
    path = out / "run.safetensors"
    saved = tensors(path)
    assert "layers.0.attention.qkv.weight" in saved and "all_x_embedder.2-1.weight" not in saved
    checkpoint = {"model.diffusion_model." + k: v for k, v in saved.items()}
    converted = convert_z_image_transformer_checkpoint_to_diffusers(checkpoint)
    assert converted.keys() == trained.keys()
    for key, value in trained.items():
        assert torch.equal(converted[key], value), key
    base = pipe.transformer.state_dict()
    assert any(not torch.equal(trained[k], base[k]) for k in base)  # it trained
    folder = ZImageTransformer2DModel.from_pretrained(out / "run" / "transformer").state_dict()
    assert all(torch.equal(folder[k], trained[k]) for k in trained)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["modelspec.architecture"] == "Z-Image"
    assert meta["ss_base_model_version"] == "z_image"


def test_lora_trains_from_single_files_and_samples_during_training(tmp_path, images):
    """Comfy-Org's single files with [flow] text_encoder, [model] vae and tokenizer_path: a LoRA
    trains and sample images are drawn through ZImagePipeline."""
    from tests.kits.zimage.tiny_files import write_tiny_zimage_files

    files = write_tiny_zimage_files(tmp_path / "files")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube --w 64 --h 80 --s 2 --d 3\n", encoding="utf-8")
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", files["transformer"], images, out, **ZIMAGE,
                          tokenizer_path=str(files["tokenizer"]), vae=str(files["ae"]),
                          text_encoder=str(files["text_encoder"]), sample_prompts=str(prompts),
                          sample_every_n_steps=2)  # fmt: skip
    assert train(config) == 0
    saved = tensors(out / "run.safetensors")
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_up.weight"))
    samples = sorted((out / "sample").glob("*.png"))
    assert samples
    from PIL import Image

    assert Image.open(samples[0]).size == (64, 80)


def test_the_dry_run_estimates_memory(tmp_path, zimage_dir, images, capfd):
    config = write_config(tmp_path / "c.toml", zimage_dir, images, tmp_path / "out", **ZIMAGE)
    assert train(config, "--dry_run") == 0
    out, err = capfd.readouterr()
    text = out + err
    assert "memory: not estimated" not in text
    assert "  memory: about " in text and "activations" in text.split("  memory: about ")[1]
