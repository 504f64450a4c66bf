"""Single-file checkpoints: our exporter's files load back identically, in the right family, and
diffusers' own single-file loader reads them the same way (the independent check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.schema import ModelSection
from library.models.families.sd.family import SD1, SD2, SD2_V, SDXL
from library.models.loader import load_components
from library.saving.checkpoint_export import write_single_file
from tests.kits.sd.tiny import build_tiny_components

TOKENIZER = Path(__file__).parents[1] / "assets" / "tokenizer"
FAMILIES = {"sd1": SD1, "sd2": SD2, "sd2-v": SD2_V}


def tiny_sdxl_parts(seed: int) -> dict:
    parts = build_tiny_components("sdxl", seed=seed)
    parts.pop("scheduler")
    return parts


def encoders(parts: dict) -> list:
    return [parts[k] for k in ("text_encoder", "text_encoder_2") if k in parts]


def export(path: Path, parts: dict, family) -> Path:
    return write_single_file(
        path, parts["unet"], parts["vae"], encoders(parts), family, torch.float32
    )


def load(path: Path, **flags):
    flags.setdefault("tokenizer_path", str(TOKENIZER))
    return load_components(
        ModelSection(pretrained_model_name_or_path=str(path), **flags), torch.float32
    )


def plain_config(module) -> dict:
    config = module.config
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    data = {k: v for k, v in data.items() if k not in ("dtype", "transformers_version")}
    return json.loads(json.dumps(data, default=list))


def assert_same_modules(expected: dict, loaded: dict, configs: bool = True) -> None:
    for name, module in expected.items():
        want, got = module.state_dict(), loaded[name].state_dict()
        assert want.keys() == got.keys(), name
        for key, tensor in want.items():
            assert torch.equal(got[key], tensor), f"{name}: {key}"
        if configs:
            assert plain_config(loaded[name]) == plain_config(module), name


def as_dict(parts) -> dict:
    found = {"unet": parts.denoiser, "vae": parts.vae, "text_encoder": parts.text_encoder}
    if len(parts.text_encoders) > 1:
        found["text_encoder_2"] = parts.text_encoders[1]
    return found


def test_round_trip_sd2_v(tmp_path):
    """SD 2.x v-prediction, which the conformance suite's tiny variants leave out (it loads SD
    1.x, 2.x and SDXL files against their folders, tests/conformance)."""
    parts = build_tiny_components("sd2-v", seed=3)
    scheduler = parts.pop("scheduler")
    path = export(tmp_path / "model.safetensors", parts, SD2_V)
    loaded = load(path)
    assert loaded.family is SD2_V
    assert loaded.model_dir == path and loaded.is_single_file
    assert loaded.objective.scheduler.config.prediction_type == scheduler.config.prediction_type
    assert_same_modules(parts, as_dict(loaded))


@pytest.mark.parametrize("name", ["sd1", "sd2", "sdxl"])
def test_tokenizers_pad_as_their_encoders(tmp_path, name):
    """OpenCLIP encoders pad with "!" (SD 2.x, SDXL's second), OpenAI CLIP with the end token
    (SD 1.x, SDXL's first), whatever the tokenizer folder says."""
    parts = tiny_sdxl_parts(seed=1) if name == "sdxl" else build_tiny_components(name, seed=3)
    parts.pop("scheduler", None)
    family = SDXL if name == "sdxl" else FAMILIES[name]
    loaded = load(export(tmp_path / "model.safetensors", parts, family))
    assert loaded.family is family
    pads = {"sd1": ["<|endoftext|>"], "sd2": ["!"], "sdxl": ["<|endoftext|>", "!"]}[name]
    assert [t.pad_token for t in loaded.tokenizers] == pads


def test_pickled_ckpt_round_trip_is_weights_only(tmp_path):
    parts = build_tiny_components("sd1", seed=2)
    parts.pop("scheduler")
    tensors = load_file(export(tmp_path / "a.safetensors", parts, SD1))
    # The Lightning layout: weights under "state_dict", next to plain training counters.
    torch.save({"state_dict": tensors, "global_step": 7, "epoch": 1}, tmp_path / "a.ckpt")
    assert_same_modules(parts, as_dict(load(tmp_path / "a.ckpt")), configs=False)


def strip_metadata(path: Path) -> Path:
    save_file(load_file(path), path)
    return path


def test_sd2_prediction_comes_from_the_flag_or_a_note(tmp_path, caplog):
    parts = build_tiny_components("sd2-v", seed=0)
    parts.pop("scheduler")
    path = strip_metadata(export(tmp_path / "v.safetensors", parts, SD2_V))
    assert load(path, v_parameterization=True).family is SD2_V
    caplog.clear()
    assert load(path).family is SD2
    assert "v_parameterization = true" in caplog.text


def test_config_derived_from_shapes_when_metadata_is_gone(tmp_path, caplog):
    parts = build_tiny_components("sd1", seed=4)
    parts.pop("scheduler")
    path = strip_metadata(export(tmp_path / "m.safetensors", parts, SD1))
    loaded = as_dict(load(path))
    assert_same_modules(parts, loaded, configs=False)
    unet = plain_config(loaded["unet"])
    for key in ("block_out_channels", "layers_per_block", "down_block_types", "up_block_types",
                "cross_attention_dim", "use_linear_projection", "attention_head_dim"):  # fmt: skip
        assert unet[key] == plain_config(parts["unet"])[key], key
    vae = plain_config(loaded["vae"])
    assert vae["block_out_channels"] == [8, 8, 16, 16] and vae["norm_num_groups"] == 8
    text = loaded["text_encoder"].config
    assert (text.hidden_size, text.num_hidden_layers, text.intermediate_size) == (32, 2, 64)
    # Head counts are not in the weights: the loader says it guessed.
    assert "guessed" in caplog.text and "num_attention_heads" in caplog.text


@pytest.mark.parametrize("name", ["sd1", "sd2-v"])
def test_diffusers_from_single_file_reads_our_file(tmp_path, name):
    from diffusers import StableDiffusionPipeline

    from tests.kits.sd.tiny import save_tiny_model

    # The config folder holds other weights (seed 9), so only the file can supply seed 5's.
    folder = save_tiny_model(tmp_path / "config", name, seed=9)
    parts = build_tiny_components(name, seed=5)
    parts.pop("scheduler")
    path = export(tmp_path / "m.safetensors", parts, FAMILIES[name])
    pipe = StableDiffusionPipeline.from_single_file(
        str(path), config=str(folder), local_files_only=True
    )
    loaded = {"unet": pipe.unet, "vae": pipe.vae, "text_encoder": pipe.text_encoder}
    assert_same_modules(parts, loaded, configs=False)


def test_diffusers_from_single_file_reads_our_sdxl_file(tmp_path):
    from diffusers import StableDiffusionXLPipeline

    from tests.kits.sd.tiny import save_tiny_model

    # The config folder holds other weights (seed 9), so only the file can supply seed 5's.
    # (diffusers tells SDXL's two encoders apart by width; the tiny ones differ, as real ones.)
    save_tiny_model(tmp_path / "config", "sdxl", seed=9)
    parts = tiny_sdxl_parts(seed=5)
    path = export(tmp_path / "xl.safetensors", parts, SDXL)
    pipe = StableDiffusionXLPipeline.from_single_file(
        str(path), config=str(tmp_path / "config"), local_files_only=True
    )
    loaded = {k: getattr(pipe, k) for k in parts}
    assert_same_modules(parts, loaded, configs=False)


def test_keys_released_files_carry_besides_the_weights_are_ignored(tmp_path):
    parts = build_tiny_components("sd2", seed=6)
    parts.pop("scheduler")
    tensors = load_file(export(tmp_path / "m.safetensors", parts, SD2))
    extra = {
        "betas": torch.rand(1000),  # the LDM training schedule
        "alphas_cumprod": torch.rand(1000),
        "model_ema.decay": torch.tensor(0.9999),
        "model_ema.diffusion_modelinput_blocks00weight": torch.rand(32, 4, 3, 3),
        "cond_stage_model.model.logit_scale": torch.tensor(4.6),
        "cond_stage_model.model.text_projection": torch.rand(32, 32),  # SD 2.x has no pooled use
    }
    save_file({**tensors, **extra}, tmp_path / "released.safetensors")
    loaded = load(tmp_path / "released.safetensors", v_parameterization=False)
    assert_same_modules(parts, as_dict(loaded), configs=False)
