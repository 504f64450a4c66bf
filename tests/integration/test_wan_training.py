"""Wan end to end through the CLI, from musubi-tuner's own files: its args (``dit``, ``t5``,
``vae``, ``task``, ``network_module = "networks.lora_wan"``, the shift draw) and its dataset
config of images, on the tiny model's single files (Comfy-Org's layouts). The LoRA file holds
musubi-tuner's ten Linears of every block, each with its alpha, and diffusers'
WanPipeline.load_lora_weights applies it exactly (base + alpha / r * up @ down); a full
fine-tune writes the transformer in the original names, which reads back exactly."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from library.models.families.wan.keys import TABLE
from tests.integration.harness import flat_toml_lines, make_images, tensors, train
from tests.kits.wan.tiny_files import write_tiny_wan_files

# musubi-tuner's ten modules of a block -> diffusers' Linear (diffusers' musubi converter)
BLOCK_LINEARS = {
    "self_attn_q": "attn1.to_q", "self_attn_k": "attn1.to_k", "self_attn_v": "attn1.to_v",
    "self_attn_o": "attn1.to_out.0", "cross_attn_q": "attn2.to_q", "cross_attn_k": "attn2.to_k",
    "cross_attn_v": "attn2.to_v", "cross_attn_o": "attn2.to_out.0", "ffn_0": "ffn.net.0.proj",
    "ffn_2": "ffn.net.2",
}  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_tiny_wan_files(tmp_path_factory.mktemp("models") / "wan", comfy=True)


def _images_dataset(root) -> list[str]:
    """musubi-tuner's dataset config lines of images with captions, 64 x 64."""
    images = make_images(root / "images", 2, size=64)
    (images / "img01.txt").write_text("a much longer caption of shape number one on a gradient")
    return ["[general]", "resolution = [64, 64]", 'caption_extension = ".txt"', "batch_size = 2",
            "enable_bucket = true", "[[datasets]]", f'image_directory = "{images}"',
            f'cache_directory = "{root / "cache"}"']  # fmt: skip


def _videos_dataset(root) -> list[str]:
    """musubi-tuner's dataset config lines of two mp4 clips of a square moving (each way) with
    captions, 64 x 64, 5 frames from the head of each (2 latent frames), beside the images."""
    from tests.kits.videos import moving_square, write_video

    folder = root / "videos"
    folder.mkdir()
    for name, reverse in (("right", False), ("left", True)):
        write_video(folder / f"{name}.mp4", moving_square(9, (64, 64), 16, reverse), fps=16)
        (folder / f"{name}.txt").write_text(f"a white square moving {name}")
    return [*_images_dataset(root), "[[datasets]]", f'video_directory = "{folder}"',
            f'cache_directory = "{root / "video_cache"}"', "resolution = [64, 64]",
            "target_frames = [5]", 'frame_extraction = "head"']  # fmt: skip


def _musubi_args(root, files, dataset_lines=_images_dataset, model=None, **extra) -> object:
    """musubi-tuner's args file and dataset config; ``model``: the keys naming the model
    (unset: musubi-tuner's dit, t5 and vae naming the single ``files``)."""
    dataset = root / "dataset.toml"
    dataset.write_text("\n".join(dataset_lines(root)) + "\n", encoding="utf-8")
    model = model or {
        "dit": str(files["transformer"]), "t5": str(files["t5"]), "vae": str(files["vae"]),
        "t5_tokenizer_path": str(files["tokenizer"]),
    }  # fmt: skip
    args = {
        **model, "dataset_config": str(dataset),
        "network_module": "networks.lora_wan", "network_dim": 4, "network_alpha": 2,
        "timestep_sampling": "shift", "discrete_flow_shift": 3.0, "max_train_steps": 2,
        "learning_rate": 1e-3, "output_dir": str(root / "out"), "output_name": "run",
        "seed": 7, "mixed_precision": "no", **extra,
    }  # fmt: skip
    lines = flat_toml_lines(args)
    path = root / "args.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("data", [_images_dataset, _videos_dataset], ids=["images", "clips"])
def test_lora_from_musubi_files_is_what_diffusers_applies(
    tmp_path, files, data, monkeypatch, kit_folders
):
    from diffusers import WanPipeline

    from library.models.families.wan.family import WanFamily

    frames = set()  # the latent frames of each micro-batch the transformer is given
    real = WanFamily.predict

    def recording(self, denoiser, noisy, *args):
        frames.add(noisy.shape[2])
        return real(self, denoiser, noisy, *args)

    monkeypatch.setattr(WanFamily, "predict", recording)
    assert train(_musubi_args(tmp_path, files, data, max_train_steps=4)) == 0
    assert frames == ({1, 2} if data is _videos_dataset else {1})
    path = tmp_path / "out" / "run.safetensors"
    saved = tensors(path)
    folder = kit_folders("wan", "t2v")  # the same seed-0 weights as the files trained on
    modules = {k.split(".", 1)[0] for k in saved}
    # ComfyUI's key map names every Linear weight of the model so: lora_unet_ + its path
    want = {"lora_unet_" + k.removesuffix(".weight").replace(".", "_")
            for k, v in TABLE.to_original(WanPipeline.from_pretrained(
                folder, local_files_only=True,
            ).transformer.state_dict()).items()
            if k.startswith("blocks.") and v.dim() == 2 and k.endswith(".weight")}  # fmt: skip
    assert modules == want and len(want) == 2 * len(BLOCK_LINEARS)
    assert {m.split("_", 4)[-1] for m in modules} == set(BLOCK_LINEARS)
    assert all(saved[f"{m}.alpha"].item() == 2 for m in modules)
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_up.weight"))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "networks.lora_wan"
    assert meta["ss_timestep_sampling"] == "shift" and meta["ss_discrete_flow_shift"] == "3.0"
    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    model = pipe.transformer
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    pipe.load_lora_weights(str(path))
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0)
    fused = {n.replace(".base_layer", ""): p for n, p in model.named_parameters()}
    for module in sorted(modules):
        down, up = saved[f"{module}.lora_down.weight"], saved[f"{module}.lora_up.weight"]
        original = module.removeprefix("lora_unet_blocks_").split("_", 1)
        weight = f"blocks.{original[0]}.{BLOCK_LINEARS[original[1]]}.weight"
        expected = base[weight] + 2 / down.shape[0] * (up.float() @ down.float())
        torch.testing.assert_close(fused[weight], expected, rtol=1e-5, atol=1e-6, msg=module)


def test_full_fine_tune_writes_the_original_names_that_reload(tmp_path, files, monkeypatch):
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.wan.family import WanFamily, load_wan

    trained = {}
    real = WanFamily.write_full_model

    def recording(self, path, denoiser, *args):
        trained.update({k: v.detach().clone() for k, v in denoiser.state_dict().items()})
        return real(self, path, denoiser, *args)

    monkeypatch.setattr(WanFamily, "write_full_model", recording)
    config = _musubi_args(tmp_path, files, train_mode="unet", learning_rate=1e-4,
                          save_precision="float")  # fmt: skip
    assert train(config) == 0
    saved = tensors(tmp_path / "out" / "run.safetensors")
    want = TABLE.to_original(trained)
    assert saved.keys() == want.keys()
    assert all(torch.equal(saved[k], v) for k, v in want.items())
    model = ModelSection(pretrained_model_name_or_path=str(tmp_path / "out" / "run.safetensors"),
                         vae=str(files["vae"]))  # fmt: skip
    flow = FlowSection(t5=str(files["t5"]), t5_tokenizer_path=str(files["tokenizer"]))
    reloaded = load_wan(model, flow, torch.float32, torch.float32).denoiser.state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in trained.items())


def _clip_pixels(reverse: bool, copies: int = 8) -> torch.Tensor:
    """The 5-frame clip of a square moving right (left with ``reverse``), [copies, 3, 5, 64, 64]
    in [-1, 1]."""
    from tests.kits.videos import moving_square

    frames = torch.from_numpy(moving_square(5, (64, 64), 16, reverse)).float() / 127.5 - 1
    return frames.permute(3, 0, 1, 2)[None].expand(copies, -1, -1, -1, -1).contiguous()


def _motion_losses(transformer_file, files) -> dict[str, float]:
    """The trained transformer's loss on the right- and the left-moving clip under the same
    draws (8 of them each), captioned alike."""
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components
    from library.training.step import micro_batch_loss
    from tests.models.step_inputs import step_inputs

    model = ModelSection(pretrained_model_name_or_path=str(transformer_file), vae=str(files["vae"]))
    flow = FlowSection(t5=str(files["t5"]), t5_tokenizer_path=str(files["tokenizer"]))
    inputs = step_inputs(load_components(model, torch.float32, flow), 3)
    batch = {"captions": ["a white square moving"] * 8, "loss_weights": torch.ones(8),
             "positions": torch.arange(8), "epoch": 0}  # fmt: skip
    with torch.no_grad():
        return {way: micro_batch_loss(inputs, {**batch, "pixel_values": _clip_pixels(reverse)})
                .item() for way, reverse in (("right", False), ("left", True))}  # fmt: skip


def _sharp_vae(files, path):
    """The files with the tiny VAE made near-deterministic (log-variance -12) and its latents
    normalised to unit scale: the random tiny VAE's posterior noise is six times its latents'
    content, which would hide any clip."""
    from library.models.wan_vae_keys import vae_to_original
    from tests.kits.krea2.tiny_files import _save
    from tests.kits.wan.tiny import build_tiny_wan_components

    vae = build_tiny_wan_components(0)["vae"]
    with torch.no_grad():
        vae.quant_conv.bias[vae.config.z_dim :] = -12.0
    config = {**dict(vae.config), "latents_mean": [0.0] * 16, "latents_std": [0.1] * 16}
    state = vae_to_original(vae.state_dict(), config)
    return {**files, "vae": _save(state, path, torch.float32, config, "vae")}


def test_a_clips_motion_is_learned(tmp_path, files):
    """A transformer fully fine-tuned on a clip of a square moving right denoises that clip
    better than one fine-tuned on the same clip played backwards, and the other way round: each
    learned its clip's motion (both clips hold the same frames, in the other order)."""
    from tests.kits.videos import moving_square, write_video

    files = _sharp_vae(files, tmp_path / "vae.safetensors")
    losses = {}
    for way, reverse in (("right", False), ("left", True)):
        root = tmp_path / way
        folder = root / "videos"
        folder.mkdir(parents=True)
        write_video(folder / "clip.mp4", moving_square(5, (64, 64), 16, reverse), fps=16)
        (folder / "clip.txt").write_text("a white square moving")

        def lines(root, folder=folder):
            return ["[general]", "resolution = [64, 64]", 'caption_extension = ".txt"',
                    "batch_size = 1", "[[datasets]]", f'video_directory = "{folder}"',
                    f'cache_directory = "{root / "cache"}"', "target_frames = [5]",
                    'frame_extraction = "head"']  # fmt: skip

        args = _musubi_args(root, files, lines, train_mode="unet", max_train_steps=40,
                            learning_rate=3e-3, save_precision="float", cache_latents=True,
                            cache_text_encoder_outputs=True)  # fmt: skip
        assert train(args) == 0
        losses[way] = _motion_losses(root / "out" / "run.safetensors", files)
    # on each clip, the model trained on it beats the one trained on the reversed clip
    assert losses["right"]["right"] < losses["left"]["right"], losses
    assert losses["left"]["left"] < losses["right"]["left"], losses


def test_ti2v_trains_from_its_folder_on_clips_and_images(tmp_path, monkeypatch):
    """Wan 2.2 TI2V-5B's folder (its 48-channel VAE, per-token timesteps) trains a LoRA on
    musubi-tuner's dataset config of clips and images: every micro-batch reaches its
    transformer as 48-channel latents of 1 or 2 latent frames, and the file holds musubi-tuner's
    ten Linears of every block, trained."""
    from library.models.families.wan.family import WanTi2vFamily
    from tests.kits.wan.tiny import write_tiny_wan_ti2v_folder

    folder = write_tiny_wan_ti2v_folder(tmp_path / "ti2v")
    seen = set()  # (channels, latent frames) of each micro-batch the transformer is given
    real = WanTi2vFamily.predict

    def recording(self, denoiser, noisy, *args):
        seen.add(tuple(noisy.shape[1:3]))
        return real(self, denoiser, noisy, *args)

    monkeypatch.setattr(WanTi2vFamily, "predict", recording)
    model = {"pretrained_model_name_or_path": str(folder)}
    path = _musubi_args(tmp_path, {}, _videos_dataset, model=model, max_train_steps=4)
    assert train(path) == 0
    assert seen == {(48, 1), (48, 2)}
    saved = tensors(tmp_path / "out" / "run.safetensors")
    modules = {k.split(".", 1)[0] for k in saved}
    assert {m.split("_", 4)[-1] for m in modules} == set(BLOCK_LINEARS) and len(modules) == 20
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_up.weight"))
