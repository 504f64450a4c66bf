"""Wan 2.1 I2V-14B trained through the CLI from musubi-tuner's words and its dataset config of
clips and images, on a tiny WanImageToVideoPipeline folder with its CLIP image encoder: every
step reaches the transformer as the noisy latents followed by the first frame's mask and latents
(36 channels) with that frame's CLIP states (cached with the latents), and diffusers'
WanImageToVideoPipeline.load_lora_weights applies the file exactly, the image keys and values
(k_img / v_img) included."""

from __future__ import annotations

from library.models.families.wan.family import WanI2vClipFamily
from tests.integration.harness import train
from tests.integration.test_wan_expert_training import _assert_applied_exactly
from tests.integration.test_wan_training import BLOCK_LINEARS, _musubi_args, _videos_dataset
from tests.kits.wan.tiny import write_tiny_wan_i2v_clip_folder

# musubi-tuner's twelve Linears of an I2V-14B block: the ten and the image keys and values
LINEARS = {**BLOCK_LINEARS, "cross_attn_k_img": "attn2.add_k_proj",
           "cross_attn_v_img": "attn2.add_v_proj"}  # fmt: skip


def test_i2v_14b_trains_on_clips_into_a_file_diffusers_applies(tmp_path, monkeypatch):
    from diffusers import WanImageToVideoPipeline

    folder = write_tiny_wan_i2v_clip_folder(tmp_path / "i2v")
    seen = set()  # (input channels, latent frames, CLIP state tokens) of each call
    real = WanI2vClipFamily.predict

    def recording(self, denoiser, noisy, timesteps, cond):
        channels = noisy.shape[1] + cond.unet_kwargs["condition"].shape[1]
        seen.add((channels, noisy.shape[2], cond.unet_kwargs["image_states"].shape[1]))
        return real(self, denoiser, noisy, timesteps, cond)

    monkeypatch.setattr(WanI2vClipFamily, "predict", recording)
    model = {"pretrained_model_name_or_path": str(folder)}  # task: the tiny model is 16 wide
    path = _musubi_args(tmp_path, {}, _videos_dataset, model=model, max_train_steps=4,
                        cache_latents=True)  # fmt: skip
    assert train(path) == 0
    assert seen == {(36, 1, 5), (36, 2, 5)}  # images and 5-frame clips, each with 5 states
    out = tmp_path / "out"
    assert [p.name for p in out.glob("*.safetensors")] == ["run.safetensors"]
    pipe = WanImageToVideoPipeline.from_pretrained(folder, local_files_only=True)
    _assert_applied_exactly(pipe, out / "run.safetensors", "transformer", LINEARS)
