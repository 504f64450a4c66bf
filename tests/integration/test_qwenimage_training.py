"""Qwen-Image end to end through the CLI on the tiny QwenImagePipeline folder: a LoRA trains for
two steps, its first step's loss equals the loss written out from diffusers' pipeline and the
model's facts, and the saved file is what diffusers' QwenImagePipeline.load_lora_weights applies
exactly (after fuse_lora: base + alpha / r * up @ down of the file's factors)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from library.training.noise import NoiseOptions, draw
from tests.integration.harness import make_images, tensors, train, write_config

QWENIMAGE = {
    "network_module": "networks.lora_qwen_image",
    "network_train_unet_only": True,
    "bucket_reso_steps": 16,
    "max_train_steps": 2,
    "train_batch_size": 2,
}
SEED = 7  # write_config's
PREFIX = "diffusion_model."


@pytest.fixture(scope="module")
def qwenimage_dir(kit_folders):
    """The session's tiny kit folder (qwenimage qwenimage, seed 0): read only."""
    return kit_folders("qwenimage", "qwenimage")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = make_images(tmp_path_factory.mktemp("data") / "imgs", 2, size=64)
    # captions of different lengths: the transformer gets the mask of their lengths
    (folder / "img01.txt").write_text("a much longer caption of shape number one on a gradient")
    return folder


@pytest.fixture(scope="module")
def pipe(qwenimage_dir):
    from diffusers import QwenImagePipeline

    return QwenImagePipeline.from_pretrained(qwenimage_dir, local_files_only=True)


@torch.no_grad()
def reference_loss(pipe, batch, shift=2.2) -> torch.Tensor:
    """The pipeline's facts written out with the trainer's keyed draws: the VAE's posterior of
    the one-frame clip, x0 = (z - latents_mean) / latents_std per channel, sigma =
    shift(sigmoid(z), 2.2), noisy = (1 - sigma) x0 + sigma noise, packed into 2x2 patches as
    the pipeline packs, the transformer at sigma on the pipeline's caption states and mask,
    target noise - x0, mean squared error times each sample's loss weight."""
    pixels = batch["pixel_values"].float().unsqueeze(2)
    posterior = pipe.vae.encode(pixels).latent_dist
    shape = tuple(posterior.mean.shape[1:])
    d = draw(SEED, batch["epoch"], batch["positions"].tolist(), shape, 1000,
             torch.device("cpu"), NoiseOptions(), flow_times=True)  # fmt: skip
    z = posterior.mean + posterior.std * d.latent_eps
    config = pipe.vae.config
    mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
    x0 = (z - mean) / std
    u = torch.sigmoid(d.time_normal)
    sigma = shift * u / (1 + (shift - 1) * u)
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * d.noise
    b, c, _, h, w = noisy.shape
    states, mask = pipe.encode_prompt(list(batch["captions"]), device="cpu")
    packed = pipe._pack_latents(noisy.transpose(1, 2), b, c, h, w)
    out = pipe.transformer(hidden_states=packed, timestep=sigma, encoder_hidden_states=states,
                           encoder_hidden_states_mask=mask, img_shapes=[[(1, h // 2, w // 2)]] * b,
                           return_dict=False)[0]  # fmt: skip
    out = pipe._unpack_latents(out, h * 8, w * 8, 8)
    per_sample = ((out - (d.noise - x0)) ** 2).mean(dim=(1, 2, 3, 4))
    return (per_sample * batch["loss_weights"].float()).mean()


def test_lora_trains_and_diffusers_applies_the_file(tmp_path, qwenimage_dir, images, pipe,
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
    config = write_config(tmp_path / "c.toml", qwenimage_dir, images, out, **QWENIMAGE)
    assert train(config) == 0

    batch, loss = first[0]
    assert len(batch["captions"]) == 2
    torch.testing.assert_close(loss, reference_loss(pipe, batch), rtol=1e-5, atol=0)

    path = out / "run.safetensors"
    saved = tensors(path)
    modules = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0]
               for k in saved}  # fmt: skip
    assert len(modules) == 2 * 12 - 3  # the 2 tiny blocks' targets (targets.py)
    assert f"{PREFIX}transformer_blocks.1.attn.add_k_proj" in modules
    assert f"{PREFIX}transformer_blocks.0.img_mlp.net.0.proj" in modules
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_up.weight"))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "networks.lora_qwen_image"
    assert meta["ss_base_model_version"] == "qwen_image"
    assert meta["modelspec.architecture"] == "Qwen-Image/lora"
    assert meta["ss_timestep_sampling"] == "shift" and meta["ss_discrete_flow_shift"] == "2.2"

    model = pipe.transformer
    base = {m: model.get_submodule(m[len(PREFIX) :]).weight.detach().clone() for m in modules}
    pipe.load_lora_weights(str(path))
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0)
    for module in sorted(modules):
        down, up = saved[f"{module}.lora_down.weight"], saved[f"{module}.lora_up.weight"]
        alpha = saved[f"{module}.alpha"].item()
        expected = base[module] + alpha / down.shape[0] * (up.float() @ down.float())
        layer = model.get_submodule(module[len(PREFIX) :])
        fused = getattr(layer, "base_layer", layer).weight.detach()
        torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6, msg=module)


def test_full_fine_tune_from_single_files_writes_a_file_that_reloads(tmp_path, images,
                                                                     monkeypatch):  # fmt: skip
    """train_mode = "unet" on Comfy-Org's single files (transformer, qwen_2.5_vl_7b with
    [flow] text_encoder, qwen_image_vae with [model] vae): the run writes the transformer alone
    in diffusers' names, tensor for tensor the trained one, which reads back (as
    pretrained_model_name_or_path, with the same component files) into exactly the trained
    transformer."""
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.qwenimage.family import QwenImageFamily
    from library.models.families.qwenimage.load import load_qwenimage
    from tests.kits.qwenimage.tiny_files import write_tiny_qwenimage_files

    trained = {}
    real = QwenImageFamily.write_full_model

    def recording(self, path, denoiser, *args):
        trained.update({k: v.detach().clone() for k, v in denoiser.state_dict().items()})
        return real(self, path, denoiser, *args)

    monkeypatch.setattr(QwenImageFamily, "write_full_model", recording)
    files = write_tiny_qwenimage_files(tmp_path / "files", dtype=torch.float32)
    out = tmp_path / "out"
    components = {"tokenizer_path": str(files["tokenizer"]), "vae": str(files["vae"]),
                  "text_encoder": str(files["text_encoder"])}  # fmt: skip
    config = write_config(tmp_path / "c.toml", files["transformer"], images, out, **QWENIMAGE,
                          **components, train_mode="unet", learning_rate=1e-4,
                          save_precision="float")  # fmt: skip
    assert train(config) == 0
    path = out / "run.safetensors"
    saved = tensors(path)
    assert saved.keys() == trained.keys()  # diffusers' names, no prefix, the transformer alone
    assert all(torch.equal(saved[k], v) for k, v in trained.items())
    base = tensors(files["transformer"])
    assert any(not torch.equal(trained[k], base[k]) for k in base)  # it trained
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["modelspec.architecture"] == "Qwen-Image"
    assert meta["ss_base_model_version"] == "qwen_image"
    model = ModelSection(pretrained_model_name_or_path=str(path),
                         tokenizer_path=components["tokenizer_path"], vae=components["vae"])  # fmt: skip
    flow = FlowSection(text_encoder=components["text_encoder"])
    reloaded = load_qwenimage(model, flow, torch.float32, torch.float32).denoiser.state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in trained.items())


def test_accumulation_and_resume_train_the_same_lora(tmp_path, qwenimage_dir, monkeypatch):
    """One batch of 4 (captions of four lengths, padded with their mask), 2 x 2 accumulated,
    and a run stopped right after its step-1 save and resumed: the same LoRA."""
    from tests.integration.harness import captioned_images, check_folder_lora_resumes

    captions = [("a shape " + "on a gradient " * i) for i in range(4)]
    images = captioned_images(tmp_path / "imgs", captions)
    run = {**QWENIMAGE, "optimizer_args": ["eps=1e-3"]}
    check_folder_lora_resumes(tmp_path, qwenimage_dir, images, run, monkeypatch)
