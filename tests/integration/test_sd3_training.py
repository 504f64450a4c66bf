"""SD3/SD3.5 end to end through the CLI on tiny models: LoRA from a diffusers folder and from
Stability's single file, kohya's SD3 names or diffusers' layout in the saved file (read back by
diffusers' own loader and by network_weights), text-encoder adapters on all three encoders, a
full fine-tune in the original single-file layout, the run plan, accumulation and resume."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from tests.integration.harness import (
    assert_close_dicts,
    check_accumulation_and_resume,
    make_images,
    tensors,
    train,
    write_config,
)
from tests.kits.sd3.tiny_files import write_tiny_sd3_files

SD3 = {
    "network_module": "networks.lora_sd3",
    "network_train_unet_only": True,
    "weighting_scheme": "logit_normal",
    "training_shift": 3.0,
    "bucket_reso_steps": 16,
}


@pytest.fixture(scope="module")
def sd3_dir(kit_folders):
    """The session's tiny kit folder (sd3 sd3.5-medium, seed 0): read only."""
    return kit_folders("sd3", "sd3.5-medium")


@pytest.fixture(scope="module")
def sd3_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sd3-files")
    return write_tiny_sd3_files(folder, "sd3.5-large", 0, text_encoders_inside=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4, size=64)


def _config(tmp_path, model, images, out, **keys):
    return write_config(tmp_path / "c.toml", model, images, out, resolution=64,
                        **{**SD3, **keys})  # fmt: skip


def test_lora_from_a_folder_saves_kohyas_sd3_names(tmp_path, sd3_dir, images, capsys):
    out = tmp_path / "out"
    config = _config(tmp_path, sd3_dir, images, out, max_train_steps=3,
                     cache_latents=True, cache_text_encoder_outputs=True)  # fmt: skip
    assert train(config) == 0
    assert "model: SD3.5 Medium (256 T5 tokens)" in capsys.readouterr().out
    path = out / "run.safetensors"
    saved = tensors(path)
    names = {k.split(".")[0] for k in saved}
    # blocks 0 (dual attention) and 1: context qkv, proj, fc1, fc2, adaLN + x the same, block 0
    # also attn2 qkv and proj; block 2 (last) context is pre-only: qkv and adaLN
    assert len(names) == (5 + 5 + 2) + (5 + 5) + (2 + 5)
    assert "lora_unet_joint_blocks_0_x_block_attn2_qkv" in names
    assert "lora_unet_joint_blocks_2_context_block_adaLN_modulation_1" in names
    assert "lora_unet_joint_blocks_2_context_block_mlp_fc1" not in names
    ups = [v for k, v in saved.items() if k.endswith("lora_up.weight")]
    assert any(v.abs().max() > 0 for v in ups)  # it trained
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_base_model_version"] == "5-medium"
    assert meta["modelspec.architecture"] == "stable-diffusion-3-5-medium/lora"
    assert "modelspec.prediction_type" not in meta
    # kohya's SD3 keys, and the shift that shaped the noise levels
    assert meta["ss_weighting_scheme"] == "logit_normal"
    assert (meta["ss_logit_mean"], meta["ss_logit_std"], meta["ss_mode_scale"]) == (
        "0.0",
        "1.0",
        "1.29",
    )
    assert (meta["ss_apply_lg_attn_mask"], meta["ss_apply_t5_attn_mask"]) == ("False", "False")
    assert meta["ss_training_shift"] == "3.0"


def test_diffusers_layout_loads_in_diffusers_and_back_as_network_weights(tmp_path, sd3_dir, images):
    """lora_format = "diffusers" with CLIP adapters: StableDiffusion3Pipeline.load_lora_weights
    takes every key and its fused weights are ours merged; network_weights reads the file back."""
    from diffusers import StableDiffusion3Pipeline

    out = tmp_path / "out"
    config = _config(tmp_path, sd3_dir, images, out, max_train_steps=2, lora_format="diffusers",
                     network_train_unet_only=False, network_alpha=2, network_dim=4)  # fmt: skip
    assert train(config) == 0
    path = out / "run.safetensors"
    saved = tensors(path)
    assert {k.split(".")[0] for k in saved} == {"transformer", "text_encoder", "text_encoder_2"}
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    base = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    pipe.load_lora_weights(str(path))
    pipe.fuse_lora(components=["transformer", "text_encoder", "text_encoder_2"])
    pipe.unload_lora_weights()  # keeps the fused weights, drops the peft wrappers
    fused = pipe.transformer.state_dict()
    # every A/B pair changed its layer by exactly B @ A (the scale is folded into B)
    for key in [k for k in saved if k.startswith("transformer.") and ".lora_A." in k]:
        layer = key[len("transformer.") : -len(".lora_A.weight")] + ".weight"
        delta = saved[key.replace("lora_A", "lora_B")] @ saved[key]
        torch.testing.assert_close(fused[layer] - base[layer], delta, atol=1e-6, rtol=1e-4)

    again = tmp_path / "again"
    config = _config(tmp_path, sd3_dir, images, again, max_train_steps=1, learning_rate=0.0,
                     lora_format="diffusers", network_train_unet_only=False, network_alpha=2,
                     network_dim=4, network_weights=str(path))  # fmt: skip
    assert train(config) == 0
    assert_close_dicts(tensors(again / "run.safetensors"), saved, atol=0)


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, sd3_file, images, capsys):
    out = tmp_path / "out"
    config = _config(tmp_path, sd3_file["model"], images, out, max_train_steps=2,
                     tokenizer_path=str(sd3_file["tokenizer"]),
                     t5_tokenizer_path=str(sd3_file["t5_tokenizer"]))  # fmt: skip
    assert train(config, "--dry_run") == 0
    printed = capsys.readouterr().out
    assert "total optimizer steps: 2" in printed
    assert not out.exists() or not any(out.iterdir())


def test_lora_from_the_single_file_with_fp8_base(tmp_path, sd3_file, images):
    out = tmp_path / "out"
    config = _config(tmp_path, sd3_file["model"], images, out, max_train_steps=2, fp8_base=True,
                     tokenizer_path=str(sd3_file["tokenizer"]),
                     t5_tokenizer_path=str(sd3_file["t5_tokenizer"]))  # fmt: skip
    assert train(config) == 0
    saved = tensors(out / "run.safetensors")
    assert any(k.startswith("lora_unet_joint_blocks_0_x_block_attn_qkv.") for k in saved)
    assert not any("attn2" in k for k in saved)  # SD3.5 Large has no dual attention


def test_all_three_text_encoders_train_with_the_mmdit(tmp_path, sd3_dir, images):
    out = tmp_path / "out"
    config = _config(tmp_path, sd3_dir, images, out, max_train_steps=2,
                     network_train_unet_only=False, network_args=["train_t5xxl=True"],
                     text_encoder_lr=[1e-3, 1e-3, 5e-4], clip_l_dropout_rate=0.3)  # fmt: skip
    assert train(config) == 0
    saved = tensors(out / "run.safetensors")
    for prefix in ("lora_unet_", "lora_te1_", "lora_te2_", "lora_te3_"):
        ups = [v for k, v in saved.items() if k.startswith(prefix) and k.endswith("lora_up.weight")]
        assert ups and max(v.abs().max().item() for v in ups) > 0, prefix


def test_full_fine_tune_writes_stabilitys_single_file_layout(tmp_path, sd3_dir, images):
    """train_mode = "unet": model.diffusion_model.* and first_stage_model.* as Stability ships
    sd3.5_medium.safetensors; diffusers' own converter turns it back into the trained MMDiT of
    the diffusers folder written beside it, and our loader reads it as a model."""
    from diffusers import StableDiffusion3Pipeline
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.sd3.original_keys import detect_sd3
    from library.models.loader import load_components

    out = tmp_path / "out"
    config = _config(tmp_path, sd3_dir, images, out, max_train_steps=2, train_mode="unet",
                     learning_rate=1e-4, network_module="networks.lora")  # fmt: skip
    assert train(config) == 0
    file = out / "run.safetensors"
    saved = tensors(file)
    with safe_open(str(file), "pt") as f:
        meta = f.metadata()
    assert detect_sd3(list(saved)) == ("original", "model.diffusion_model.")
    assert any(k.startswith("first_stage_model.") for k in saved)
    assert meta["modelspec.architecture"] == "stable-diffusion-3-5-medium"
    folder = StableDiffusion3Pipeline.from_pretrained(out / "run").transformer.state_dict()
    base = StableDiffusion3Pipeline.from_pretrained(sd3_dir).transformer.state_dict()
    assert any(not torch.equal(folder[k], base[k]) for k in base)  # it trained
    head = "model.diffusion_model."
    original = {k[len(head) :]: v for k, v in saved.items() if k.startswith(head)}
    converted = convert_sd3_transformer_checkpoint_to_diffusers(original)
    assert converted.keys() == folder.keys()
    for key, value in folder.items():
        torch.testing.assert_close(converted[key], value, rtol=0, atol=0)
    parts = write_tiny_sd3_files(tmp_path / "files", "sd3.5-medium", 0, text_encoders_inside=False)
    model = ModelSection(pretrained_model_name_or_path=str(file),
                         tokenizer_path=str(parts["tokenizer"]))  # fmt: skip
    flow = FlowSection(clip_l=str(parts["clip_l"]), clip_g=str(parts["clip_g"]),
                       t5xxl=str(parts["t5xxl"]), t5_tokenizer_path=str(parts["t5_tokenizer"]))  # fmt: skip
    loaded = load_components(model, torch.float32, flow).denoiser.state_dict()
    for key, value in folder.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


def test_accumulation_and_resume_train_the_same_lora(tmp_path, sd3_dir, images, monkeypatch):
    """4 samples per step as one batch of 4, as 2 x 2 accumulated, and stopped and resumed, with
    text dropout, random position crops and scaled position tables on: each sample's draws
    follow the sample."""

    def make_config(folder, out, **keys):
        return _config(folder, sd3_dir, images, out, **keys)

    # eps=1e-3: Adam's first updates follow the gradient instead of its sign, so the comparison
    # checks the gradients (tests/distributed does the same).
    common = {"max_train_steps": 2, "train_batch_size": 4, "clip_g_dropout_rate": 0.5,
              "t5_dropout_rate": 0.5, "pos_emb_random_crop_rate": 0.5,
              "enable_scaled_pos_embed": True, "optimizer_args": ["eps=1e-3"]}  # fmt: skip
    check_accumulation_and_resume(tmp_path, make_config, common, monkeypatch)
