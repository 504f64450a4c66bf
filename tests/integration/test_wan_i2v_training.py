"""Wan 2.2 I2V-A14B trained through the CLI from musubi-tuner's words and its dataset config of clips and images, on a tiny WanImageToVideoPipeline folder: every step
reaches an expert as the noisy latents followed by the first frame's mask and latents (36
channels), both experts train, one file each, and diffusers' WanImageToVideoPipeline
.load_lora_weights applies each file exactly (the low-noise one into transformer_2); runs on
clips are layout invariant and resume exactly."""

from __future__ import annotations

from library.models.families.wan.family import WanFamily
from tests.integration.harness import train
from tests.integration.test_wan_expert_training import SUBS, _assert_applied_exactly
from tests.integration.test_wan_training import _musubi_args, _videos_dataset
from tests.kits.wan.tiny import write_tiny_wan_i2v_folder


def test_both_i2v_experts_train_on_clips_into_files_diffusers_apply(tmp_path, monkeypatch):
    from diffusers import WanImageToVideoPipeline

    folder = write_tiny_wan_i2v_folder(tmp_path / "i2v")
    seen = set()  # (input channels, latent frames) of each call of an expert
    real = WanFamily.predict

    def recording(self, denoiser, noisy, *args):
        seen.add(tuple(noisy.shape[1:3]))
        return real(self, denoiser, noisy, *args)

    monkeypatch.setattr(WanFamily, "predict", recording)
    model = {"pretrained_model_name_or_path": str(folder)}  # task: the tiny model is 16 wide
    path = _musubi_args(tmp_path, {}, _videos_dataset, model=model, max_train_steps=6,
                        cache_latents=True)  # the first frames cached with the clips' latents
    assert train(path) == 0
    assert seen == {(36, 1), (36, 2)}  # images and 5-frame clips, each with its first frame
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.safetensors")) == [
        "run_high_noise.safetensors", "run_low_noise.safetensors"
    ]  # fmt: skip
    for expert, sub in SUBS.items():
        pipe = WanImageToVideoPipeline.from_pretrained(folder, local_files_only=True)
        load = {"load_into_transformer_2": True} if sub == "transformer_2" else {}
        _assert_applied_exactly(pipe, out / f"run_{expert}.safetensors", sub, **load)


def test_i2v_runs_on_clips_are_layout_invariant_and_resume_exactly(tmp_path, monkeypatch):
    """4 clips (their first frames cached with their latents) a step as one batch and as 2 x 2
    accumulated micro-batches, and a run stopped after its step-1 save and resumed: the same
    two expert files."""
    from tests.integration.harness import check_accumulation_and_resume, write_config
    from tests.kits.videos import moving_square, write_video

    folder = write_tiny_wan_i2v_folder(tmp_path / "i2v")
    videos = tmp_path / "videos"
    videos.mkdir()
    for i, (count, reverse) in enumerate(((9, False), (9, True), (13, False), (13, True))):
        write_video(videos / f"v{i}.mp4", moving_square(count, (64, 64), 16, reverse), fps=16)
    clips = {"video_directory": str(videos), "target_frames": [5], "frame_extraction": "head"}

    def make_config(where, out, **keys):
        return write_config(where / "c.toml", folder, videos, out, subset_keys=clips, **keys)

    common = {"network_module": "networks.lora_wan", "network_train_unet_only": True,
              "mixed_precision": "no", "cache_latents": True, "max_train_steps": 3,
              "train_batch_size": 4}  # fmt: skip
    names = tuple(f"run_{e}.safetensors" for e in SUBS)
    check_accumulation_and_resume(tmp_path, make_config, common, monkeypatch, names, (1e-5, 1e-5))
