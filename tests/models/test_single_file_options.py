"""Model options: vae override (file or folder), no_half_vae, zero_terminal_snr, clip_skip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError, ModelError
from library.models.families.sd.family import SD1, SDXL
from library.models.loader import load_components
from library.models.original_names import VAE_PREFIX, vae_state_dict_to_original
from library.models.text import encode_token_ids
from library.saving.checkpoint_export import write_single_file
from tests.kits.sd.tiny import build_tiny_components, tiny_text_config, tiny_vae_config

TOKENIZER = Path(__file__).parents[1] / "assets" / "tokenizer"


def load(path, dtype=torch.float32, **flags):
    return load_components(ModelSection(pretrained_model_name_or_path=str(path), **flags), dtype)


@pytest.fixture(scope="module")
def other_vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(7)
    return AutoencoderKL(**tiny_vae_config())


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def vae_sources(vae, folder: Path) -> dict[str, Path]:
    """The same VAE as an original-layout file (bare and prefixed), a diffusers-layout file and
    a diffusers folder."""
    original = vae_state_dict_to_original(vae.state_dict(), 4)
    save_file(original, folder / "vae-ft.safetensors")
    save_file({VAE_PREFIX + k: v for k, v in original.items()}, folder / "prefixed.safetensors")
    save_file(vae.state_dict(), folder / "diffusers.safetensors")
    vae.save_pretrained(folder / "vae_folder")
    return {p: folder / p for p in ("vae-ft.safetensors", "prefixed.safetensors",
                                    "diffusers.safetensors", "vae_folder")}  # fmt: skip


def test_vae_override_from_every_kind_of_source(tiny_model_dir, other_vae, tmp_path):
    base = load(tiny_model_dir)
    assert not same_weights(base.vae, other_vae)
    for name, source in vae_sources(other_vae, tmp_path).items():
        parts = load(tiny_model_dir, vae=str(source))
        assert same_weights(parts.vae, other_vae), name
        assert not parts.vae.training and not any(p.requires_grad for p in parts.vae.parameters())
        assert parts.vae.config.scaling_factor == base.vae.config.scaling_factor


def test_vae_override_of_a_single_file_model(tmp_path, other_vae):
    parts = build_tiny_components("sd1")
    path = write_single_file(
        tmp_path / "m.safetensors", parts["unet"], parts["vae"], [parts["text_encoder"]], SD1,
        torch.float32,
    )  # fmt: skip
    save_file(vae_state_dict_to_original(other_vae.state_dict(), 4), tmp_path / "v.safetensors")
    loaded = load(path, tokenizer_path=str(TOKENIZER), vae=str(tmp_path / "v.safetensors"))
    assert same_weights(loaded.vae, other_vae)


def test_vae_override_errors(tiny_model_dir, tmp_path):
    save_file({"foo": torch.zeros(1)}, tmp_path / "foo.safetensors")
    with pytest.raises(ModelError, match="holds no VAE weights"):
        load(tiny_model_dir, vae=str(tmp_path / "foo.safetensors"))
    with pytest.raises(ModelError, match="does not exist"):
        load(tiny_model_dir, vae=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ModelError, match="no config.json"):
        load(tiny_model_dir, vae=str(tmp_path))


def test_no_half_vae_keeps_the_vae_float32(tiny_model_dir, other_vae, tmp_path):
    parts = load(tiny_model_dir, torch.bfloat16, no_half_vae=True)
    assert parts.vae.dtype == torch.float32 and parts.denoiser.dtype == torch.bfloat16
    assert parts.text_encoder.dtype == torch.bfloat16
    assert load(tiny_model_dir, torch.bfloat16).vae.dtype == torch.bfloat16
    save_file(vae_state_dict_to_original(other_vae.state_dict(), 4), tmp_path / "v.safetensors")
    override = load(tiny_model_dir, torch.bfloat16, no_half_vae=True, vae=str(tmp_path / "v.safetensors"))  # fmt: skip
    assert override.vae.dtype == torch.float32 and same_weights(override.vae, other_vae)


def test_zero_terminal_snr_rescales_the_betas(tiny_sd2v_model_dir):
    parts = load(tiny_sd2v_model_dir, zero_terminal_snr=True)
    # Lin et al. 2023, algorithm 1, computed here in float64 from the scaled-linear betas:
    # shift sqrt(alpha_bar) so the last is 0, scale so the first is unchanged.
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    root = torch.cumprod(1 - betas, 0).sqrt()
    first, last = root[0].clone(), root[-1].clone()
    expected = ((root - last) * first / (first - last)) ** 2
    got = parts.objective.scheduler.alphas_cumprod.to(torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    assert got[-1] == 0
    plain = load(tiny_sd2v_model_dir).objective.scheduler.alphas_cumprod
    assert plain[-1] > 0 and torch.isclose(plain[0], parts.objective.scheduler.alphas_cumprod[0])


def test_zero_terminal_snr_needs_v_prediction(tiny_model_dir):
    with pytest.raises(ConfigError, match="zero_terminal_snr needs v-prediction"):
        load(tiny_model_dir, zero_terminal_snr=True)
    assert load(tiny_model_dir, zero_terminal_snr=True, v_parameterization=True)


def test_clip_skip_on_sdxl_is_ignored_with_sd_scripts_warning(caplog):
    # sd-scripts warns that clip_skip does nothing for SDXL and trains; anime SDXL presets set it
    with caplog.at_level("WARNING"):
        SDXL.check_options(ModelSection(pretrained_model_name_or_path="x", clip_skip=2), FlowSection())
    assert "clip_skip = 2 is ignored" in caplog.text and "SDXL" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        SDXL.check_options(ModelSection(pretrained_model_name_or_path="x", clip_skip=1), FlowSection())
    assert caplog.text == ""


@pytest.mark.parametrize("with_projection", [False, True])
def test_clip_skip_equals_a_shorter_encoder(with_projection):
    """clip_skip = N is the encoder cut after layer L - N + 1, with its final layer norm."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cls = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    config = {**tiny_text_config("sd1"), "num_hidden_layers": 4}
    torch.manual_seed(0)
    full = cls(CLIPTextConfig(**config)).eval()
    ids = torch.randint(0, 500, (2, 77))
    with torch.no_grad():
        assert torch.equal(encode_token_ids(full, ids, 1), full(ids).last_hidden_state)
        for skip in (2, 3, 4):
            short = cls(CLIPTextConfig(**{**config, "num_hidden_layers": 5 - skip})).eval()
            short.load_state_dict(full.state_dict(), strict=False)
            got = encode_token_ids(full, ids, skip)
            torch.testing.assert_close(got, short(ids).last_hidden_state, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="outside 1..4"):
        encode_token_ids(full, ids, 5)
