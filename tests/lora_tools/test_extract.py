"""``lora_tool.py extract``: the SVD of tuned - base recovers a LoRA's change at its rank, in the
kohya names and layout the trainer writes, and the file loads as network_weights."""

from __future__ import annotations

import json

import pytest
import torch

from library.lora_tools.svd import svd_of_matrix
from tests.lora_tools.model_helpers import (
    TrainedLora,
    error_lines,
    kohya_deltas,
    load,
    model_dir,
    module_of,
    read,
    run_tool,
)

RANK, CONV_RANK = 4, 2


@pytest.fixture(scope="module")
def sd1(tmp_path_factory, kit_folders):
    """An SD 1.x LoRA L (with LoCon convs), the base merged with L, and the LoRA extracted from
    the two at L's ranks."""
    root = tmp_path_factory.mktemp("extract")
    base_dir = model_dir("sd1", kit_folders)
    base = load(base_dir)
    lora = TrainedLora(base, rank=RANK, alpha=3.0, conv=(CONV_RANK, 1.0), seed=11, std=0.2)
    path = lora.save(root / "lora.safetensors")
    tuned = root / "tuned"
    assert run_tool("merge", "--model", base_dir, "--loras", path, "--output_dir", tuned) == 0
    out = root / "extracted.safetensors"
    code = run_tool(
        "extract", "--base", base_dir, "--tuned", tuned, "--rank", RANK,
        "--conv_rank", CONV_RANK, "--min_diff", 0, "--output", out,
    )  # fmt: skip
    assert code == 0
    return {
        "root": root,
        "base_dir": base_dir,
        "base": base,
        "lora": lora,
        "tuned": tuned,
        "file": out,
    }


def test_extract_recovers_every_module_at_its_rank(sd1):
    original = sd1["lora"].tensors
    extracted, metadata = read(sd1["file"])
    assert sorted(extracted) == sorted(original)  # same modules, same kohya names
    want, got = kohya_deltas(original), kohya_deltas(extracted)
    for name, delta in want.items():
        torch.testing.assert_close(got[name], delta, rtol=1e-4, atol=2e-6, msg=name)
        down = extracted[f"{name}.lora_down.weight"]
        assert down.shape == original[f"{name}.lora_down.weight"].shape  # L's rank and layout
        assert float(extracted[f"{name}.alpha"]) == down.shape[0]  # scale 1
    assert metadata["ss_network_module"] == "networks.lora"
    assert metadata["ss_network_dim"] == str(RANK)
    assert metadata["ss_base_model_version"] == "sd_v1"
    assert json.loads(metadata["ss_network_args"])["conv_dim"] == str(CONV_RANK)
    assert metadata["modelspec.architecture"] == "stable-diffusion-v1/lora"


def test_merge_then_extract_round_trips(sd1, tmp_path):
    """Merging the extracted file into the base gives the tuned model again."""
    again = tmp_path / "again"
    code = run_tool(
        "merge", "--model", sd1["base_dir"], "--loras", sd1["file"], "--output_dir", again
    )
    assert code == 0
    tuned, rebuilt = load(sd1["tuned"]), load(again)
    for key in sd1["lora"].deltas:
        torch.testing.assert_close(
            module_of(rebuilt, *key).weight, module_of(tuned, *key).weight, rtol=1e-5, atol=1e-6
        )


def test_extracted_file_loads_as_network_weights(sd1):
    """The trainer's import: adapters of the same ranks injected as library/training/setup.py
    does, then family.load_lora_tensors; the adapters then make L's change."""
    from library.networks.lora import LoraSpec, apply_lora, lora_layers
    from tests.lora_tools.model_helpers import peft_delta

    model = load(sd1["base_dir"])
    family = model.family
    spec = LoraSpec(RANK, float(RANK), CONV_RANK, float(CONV_RANK))
    apply_lora(model.denoiser, family.adapter_targets(model.denoiser, "unet", True), spec)
    encoder = model.text_encoders[0]
    apply_lora(encoder, family.adapter_targets(encoder, "text_encoder", False), spec)
    models = {"lora_unet": model.denoiser, family.text_encoder_lora_prefixes[0]: encoder}
    tensors, _ = read(sd1["file"])
    family.load_lora_tensors(models, tensors, str(sd1["file"]))
    roles = {"lora_unet": "denoiser", family.text_encoder_lora_prefixes[0]: 0}
    for prefix, adapted in models.items():
        for path, layer in lora_layers(adapted).items():
            want = sd1["lora"].deltas[(roles[prefix], path)]
            torch.testing.assert_close(peft_delta(layer), want, rtol=1e-4, atol=2e-6, msg=path)


def test_flux_fused_modules_and_trainer_import(tmp_path, kit_folders):
    """FLUX.1: q/k/v (and a single block's MLP input) are factored per diffusers Linear and
    written as one block-diagonal kohya module, as the trainer writes them."""
    from library.networks.lora import LoraSpec, apply_lora, lora_layers
    from tests.lora_tools.model_helpers import peft_delta

    base_dir = model_dir("flux", kit_folders)
    base = load(base_dir)
    lora = TrainedLora(base, rank=RANK, alpha=2.0, seed=12, std=0.2)
    path = lora.save(tmp_path / "flux.safetensors")
    tuned = tmp_path / "tuned"
    assert run_tool("merge", "--model", base_dir, "--loras", path, "--output_dir", tuned) == 0
    out = tmp_path / "flux_extracted.safetensors"
    code = run_tool(
        "extract", "--base", base_dir, "--tuned", tuned, "--rank", RANK, "--min_diff", 0,
        "--output", out,
    )  # fmt: skip
    assert code == 0
    extracted, metadata = read(out)
    assert sorted(extracted) == sorted(lora.tensors)
    want, got = kohya_deltas(lora.tensors), kohya_deltas(extracted)
    for name, delta in want.items():
        torch.testing.assert_close(got[name], delta, rtol=1e-4, atol=2e-6, msg=name)
        assert (
            extracted[f"{name}.lora_down.weight"].shape
            == lora.tensors[f"{name}.lora_down.weight"].shape
        )
    assert metadata["ss_base_model_version"] == "flux1"
    model = load(base_dir)
    family = model.family
    spec = LoraSpec(RANK, float(RANK))
    apply_lora(model.denoiser, family.adapter_targets(model.denoiser, "unet", False), spec)
    clip = model.text_encoders[0]
    apply_lora(clip, family.adapter_targets(clip, "text_encoder", False), spec)
    models = {"lora_unet": model.denoiser, "lora_te1": clip}
    family.load_lora_tensors(models, extracted, str(out))
    for prefix, role in (("lora_unet", "denoiser"), ("lora_te1", 0)):
        for path_, layer in lora_layers(models[prefix]).items():
            torch.testing.assert_close(
                peft_delta(layer), lora.deltas[(role, path_)], rtol=1e-4, atol=2e-6, msg=path_
            )


def test_small_changes_are_skipped_and_listed(sd1, tmp_path, capsys):
    """A UNet-only LoRA leaves the text encoder as it was: its layers are skipped and named."""
    lora = TrainedLora(sd1["base"], rank=2, alpha=2.0, text=False, seed=13, std=0.2)
    path = lora.save(tmp_path / "unet_only.safetensors")
    tuned = tmp_path / "tuned"
    assert (
        run_tool("merge", "--model", sd1["base_dir"], "--loras", path, "--output_dir", tuned) == 0
    )
    out = tmp_path / "x.safetensors"
    capsys.readouterr()
    code = run_tool(
        "extract", "--base", sd1["base_dir"], "--tuned", tuned, "--rank", 2, "--output", out
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "skipped 12 text encoder layers" in printed
    assert "lora_te_text_model_encoder_layers_0_mlp_fc1" in printed
    tensors, metadata = read(out)
    assert not any(k.startswith("lora_te_") for k in tensors)
    assert metadata["ss_network_train_unet_only"] == "True"
    # a dynamic rank never exceeds --rank; sv_fro 1.0 keeps each change whole
    code = run_tool(
        "extract", "--base", sd1["base_dir"], "--tuned", tuned, "--rank", 8, "--output",
        tmp_path / "dyn.safetensors", "--dynamic_method", "sv_fro", "--dynamic_param", 1.0,
    )  # fmt: skip
    assert code == 0
    dynamic, meta = read(tmp_path / "dyn.safetensors")
    assert meta["ss_network_dim"] == "Dynamic"
    for name, delta in kohya_deltas(lora.tensors).items():
        assert dynamic[f"{name}.lora_down.weight"].shape[0] <= 8
        torch.testing.assert_close(kohya_deltas(dynamic)[name], delta, rtol=1e-4, atol=2e-6)


def test_refusals(sd1, tmp_path, kit_folders, capsys):
    existing = tmp_path / "exists.safetensors"
    existing.write_bytes(b"keep")
    args = ["--rank", 2, "--output", existing]
    assert run_tool("extract", "--base", sd1["base_dir"], "--tuned", sd1["tuned"], *args) == 2
    assert "--overwrite" in error_lines(capsys.readouterr().err)[0]
    assert existing.read_bytes() == b"keep"
    out = tmp_path / "new.safetensors"
    code = run_tool(
        "extract",
        "--base",
        tmp_path / "missing",
        "--tuned",
        sd1["tuned"],
        "--rank",
        2,
        "--output",
        out,
    )
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "--base" in line and "not found" in line
    sdxl = model_dir("sdxl", kit_folders)
    code = run_tool(
        "extract", "--base", sd1["base_dir"], "--tuned", sdxl, "--rank", 2, "--output", out
    )
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "SDXL" in line and "SD 1.x" in line
    code = run_tool(
        "extract",
        "--base",
        sd1["base_dir"],
        "--tuned",
        sd1["base_dir"],
        "--rank",
        2,
        "--output",
        out,
    )
    assert code == 2 and "nothing to extract" in error_lines(capsys.readouterr().err)[0]
    assert not out.exists()


@pytest.mark.parametrize("shape", [(12, 40), (40, 12), (16, 16)])
def test_the_svd_runs_on_the_tall_orientation_and_gives_the_same_factors(shape, monkeypatch):
    """A wide change is decomposed as its transpose (about half the LAPACK cost,
    bench/svd_orientation.py); the factors are torch's of the matrix as it is, each singular
    pair up to sign."""
    matrix = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want_u, want_s, want_vh = torch.linalg.svd(matrix, full_matrices=False)
    seen = []
    real = torch.linalg.svd

    def recording(m, *args, **kwargs):
        seen.append(tuple(m.shape))
        return real(m, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "svd", recording)
    got = svd_of_matrix(matrix)
    assert seen == [(max(shape), min(shape))]
    torch.testing.assert_close(got.S, want_s)
    signs = torch.sign((got.U * want_u).sum(0))
    assert torch.all(signs.abs() == 1)
    torch.testing.assert_close(got.U * signs, want_u)
    torch.testing.assert_close(got.Vh * signs[:, None], want_vh)
