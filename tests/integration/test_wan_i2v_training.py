"""Wan 2.2 I2V-A14B trained through the CLI from musubi-tuner's words and its dataset config of clips and images, on a tiny WanImageToVideoPipeline folder: every step
reaches an expert as the noisy latents followed by the first frame's mask and latents (36
channels), both experts train, one file each, and diffusers' WanImageToVideoPipeline
.load_lora_weights applies each file exactly (the low-noise one into transformer_2)."""

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
