"""``lora_tool.py merge``: LoRAs baked into a base model give base + ratio * alpha/r * up @ down
per layer, the same model diffusers' own load_lora_weights runs, in the layout the trainer writes
full fine-tunes in; and the refusals."""

from __future__ import annotations

import pytest
import torch

from tests.lora_tools.model_helpers import (
    ASSETS,
    TrainedLora,
    error_lines,
    load,
    model_dir,
    module_of,
    read,
    run_tool,
)

RATIOS = (0.8, -0.5)


@pytest.fixture(scope="module")
def sd1(tmp_path_factory, kit_folders):
    """The SD 1.x base, two LoRAs of it (A: UNet + text encoder + LoCon convs, B: UNet only,
    another rank and alpha) and the model merged with both (a file and a folder)."""
    root = tmp_path_factory.mktemp("merge")
    base_dir = model_dir("sd1", kit_folders)
    base = load(base_dir)
    lora_a = TrainedLora(base, rank=4, alpha=2.0, conv=(2, 1.0), seed=1)
    lora_b = TrainedLora(base, rank=3, alpha=5.0, text=False, seed=2)
    paths = (lora_a.save(root / "a.safetensors"), lora_b.save(root / "b.safetensors"))
    out, folder = root / "merged.safetensors", root / "merged"
    code = run_tool(
        "merge", "--model", base_dir, "--loras", *paths, "--ratios", *RATIOS,
        "--output", out, "--output_dir", folder,
    )  # fmt: skip
    assert code == 0
    return {
        "root": root,
        "base_dir": base_dir,
        "base": base,
        "loras": (lora_a, lora_b),
        "paths": paths,
        "file": out,
        "folder": folder,
    }


def _expected(base, loras, ratios):
    """(role, path) -> base weight + sum of ratio * the adapters' own delta, in float64."""
    expected = {}
    for lora, ratio in zip(loras, ratios, strict=True):
        for key, delta in lora.deltas.items():
            if key not in expected:
                expected[key] = module_of(base, *key).weight.detach().double()
            expected[key] = expected[key] + ratio * delta
    return expected


@pytest.mark.parametrize("written", ["file", "folder"])
def test_merged_weights_are_base_plus_each_lora(sd1, written):
    base = sd1["base"]
    options = {"tokenizer_path": str(ASSETS / "tokenizer")} if written == "file" else {}
    merged = load(sd1[written], **options)
    expected = _expected(base, sd1["loras"], RATIOS)
    assert len(expected) == 79 + 12  # UNet attention + LoCon convs, CLIP q/k/v/out/fc1/fc2
    for (role, path), weight in expected.items():
        got = module_of(merged, role, path).weight.detach().double()
        torch.testing.assert_close(got, weight, rtol=1e-5, atol=1e-6, msg=path)
        # the change is there (not merely "close to base")
        assert (got - module_of(base, role, path).weight.double()).abs().max() > 1e-4
    # layers no LoRA names are untouched, bit for bit
    untouched = ["conv_in", "time_embedding.linear_1", "conv_out"]
    for path in untouched:
        assert torch.equal(
            module_of(merged, "denoiser", path).weight, module_of(base, "denoiser", path).weight
        )
    assert merged.family.name == "sd1"


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
def test_merged_model_runs_like_diffusers_load_lora_weights(sd1):
    """The independent reference: diffusers' pipeline with the file attached through peft at
    the same scale computes what the merged model computes."""
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    pipe = StableDiffusionPipeline.from_pretrained(sd1["base_dir"], safety_checker=None)
    pipe.load_lora_weights(str(sd1["paths"][0]), adapter_name="a")
    pipe.load_lora_weights(str(sd1["paths"][1]), adapter_name="b")
    pipe.set_adapters(["a", "b"], adapter_weights=list(RATIOS))
    unet = UNet2DConditionModel.from_pretrained(sd1["folder"], subfolder="unet")
    text = CLIPTextModel.from_pretrained(sd1["folder"], subfolder="text_encoder")
    gen = torch.Generator().manual_seed(3)
    latents, context = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 77, 32, generator=gen)
    ids = torch.randint(0, 500, (2, 77), generator=gen)
    with torch.no_grad():
        theirs = pipe.unet(latents, torch.tensor([10, 600]), context).sample
        ours = unet(latents, torch.tensor([10, 600]), context).sample
        plain = sd1["base"].denoiser(latents, torch.tensor([10, 600]), context).sample
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        assert (ours - plain).abs().max() > 1e-3
        torch.testing.assert_close(text(ids)[0], pipe.text_encoder(ids)[0], rtol=1e-4, atol=1e-5)


def test_output_is_the_trainers_full_model_layout(sd1):
    tensors, metadata = read(sd1["file"])
    assert any(k.startswith("model.diffusion_model.input_blocks.") for k in tensors)
    assert any(k.startswith("cond_stage_model.transformer.text_model.") for k in tensors)
    assert any(k.startswith("first_stage_model.") for k in tensors)
    assert metadata["modelspec.architecture"] == "stable-diffusion-v1"
    assert "a.safetensors" in metadata["modelspec.merged_from"]
    assert (sd1["folder"] / "model_index.json").is_file()
    assert (sd1["folder"] / "tokenizer" / "vocab.json").is_file()


def test_fused_flux_modules_into_the_transformer_file(tmp_path, kit_folders):
    """FLUX.1 (fused q/k/v modules) into its one-file layout, the transformer in Black Forest
    Labs' names, at a ratio. (Every family's default LoRA into a diffusers folder, SDXL's kohya
    names in SGM's layout among them: the conformance suite, tests/conformance.)"""
    from library.models.families.flux.original_keys import transformer_from_original

    base_dir = model_dir("flux", kit_folders)
    base = load(base_dir)
    lora = TrainedLora(base, rank=4, alpha=8.0, seed=5, text=False)
    path = lora.save(tmp_path / "flux.safetensors")
    out = tmp_path / "flux_merged.safetensors"
    code = run_tool("merge", "--model", base_dir, "--loras", path, "--ratios", 0.6, "--output", out)
    assert code == 0
    expected = _expected(base, [lora], [0.6])
    state = transformer_from_original(read(out)[0])
    assert len(expected) == 2 * 14 + 2 * 6  # every Linear of 2 double + 2 single blocks
    for (_, path_), weight in expected.items():
        got = state[f"{path_}.weight"].double()
        torch.testing.assert_close(got, weight, rtol=1e-5, atol=1e-6, msg=path_)


def test_text_encoder_modules_need_a_place_in_the_output(tmp_path, kit_folders, capsys):
    base_dir = model_dir("flux", kit_folders)
    lora = TrainedLora(load(base_dir), rank=2, alpha=2.0, seed=6)  # with CLIP-L modules
    path = lora.save(tmp_path / "flux_te.safetensors")
    out = tmp_path / "flux.safetensors"
    assert run_tool("merge", "--model", base_dir, "--loras", path, "--output", out) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "CLIP-L" in line and "--denoiser_only" in line
    assert not out.exists()
    code = run_tool(
        "merge", "--model", base_dir, "--loras", path, "--output", out, "--denoiser_only"
    )
    assert code == 0 and out.is_file()
    assert "left out" in capsys.readouterr().out


def test_refusals(sd1, tmp_path, kit_folders, capsys):
    base_dir, lora = sd1["base_dir"], sd1["paths"][0]
    # a model that is not there
    code = run_tool(
        "merge",
        "--model",
        tmp_path / "nope",
        "--loras",
        lora,
        "--output",
        tmp_path / "x.safetensors",
    )
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "--model" in line and "not found" in line
    # an existing output without --overwrite: nothing is written
    existing = tmp_path / "exists.safetensors"
    existing.write_bytes(b"keep me")
    code = run_tool("merge", "--model", base_dir, "--loras", lora, "--output", existing)
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "--overwrite" in line
    assert existing.read_bytes() == b"keep me"
    # a LoRA of another family: an SDXL LoRA on the SD 1.x model
    sdxl = load(model_dir("sdxl", kit_folders))
    other = TrainedLora(sdxl, rank=2, alpha=2.0, seed=7).save(tmp_path / "sdxl_lora.safetensors")
    out = tmp_path / "other.safetensors"
    code = run_tool("merge", "--model", base_dir, "--loras", other, "--output", out)
    (line,) = error_lines(capsys.readouterr().err)
    assert code == 2 and "SDXL" in line and "lora_" in line and "--skip_unknown" in line
    assert not out.exists()
    # --ratios must match --loras
    code = run_tool(
        "merge", "--model", base_dir, "--loras", lora, "--ratios", 1, 2, "--output", out
    )
    assert code == 2 and "--ratios" in error_lines(capsys.readouterr().err)[0]


def test_skip_unknown_lists_the_modules_left_out(sd1, tmp_path, capsys):
    from safetensors.torch import save_file

    tensors, _ = read(sd1["paths"][1])
    tensors["lora_unet_not_a_layer.lora_down.weight"] = torch.zeros(2, 4)
    tensors["lora_unet_not_a_layer.lora_up.weight"] = torch.zeros(4, 2)
    path = tmp_path / "extra.safetensors"
    save_file(tensors, str(path))
    out = tmp_path / "skipped"
    assert run_tool("merge", "--model", sd1["base_dir"], "--loras", path, "--output_dir", out) == 2
    assert "lora_unet_not_a_layer" in error_lines(capsys.readouterr().err)[0]
    code = run_tool(
        "merge", "--model", sd1["base_dir"], "--loras", path, "--output_dir", out,
        "--skip_unknown", "--ratios", "-0.5",
    )  # fmt: skip
    assert code == 0
    assert "lora_unet_not_a_layer" in capsys.readouterr().out
    merged = load(out)
    for key, weight in _expected(sd1["base"], [sd1["loras"][1]], [-0.5]).items():
        torch.testing.assert_close(
            module_of(merged, *key).weight.detach().double(), weight, rtol=1e-5, atol=1e-6
        )


def test_lycoris_loha_module_is_merged_by_its_own_formula(sd1, tmp_path):
    """A LoHa module: W + ratio * alpha / r * (w1_a @ w1_b) * (w2_a @ w2_b), by hand."""
    path = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"
    name = "lora_unet_" + path.replace(".", "_")
    layer = module_of(sd1["base"], "denoiser", path)
    out_dim, in_dim = layer.weight.shape
    gen = torch.Generator().manual_seed(9)
    parts = {
        "hada_w1_a": torch.randn(out_dim, 3, generator=gen) * 0.3,
        "hada_w1_b": torch.randn(3, in_dim, generator=gen) * 0.3,
        "hada_w2_a": torch.randn(out_dim, 3, generator=gen) * 0.3,
        "hada_w2_b": torch.randn(3, in_dim, generator=gen) * 0.3,
        "alpha": torch.tensor(1.5),
    }
    from safetensors.torch import save_file

    file = tmp_path / "loha.safetensors"
    save_file({f"{name}.{k}": v for k, v in parts.items()}, str(file))
    out = tmp_path / "loha_merged"
    code = run_tool(
        "merge", "--model", sd1["base_dir"], "--loras", file, "--ratios", 0.7, "--output_dir", out
    )
    assert code == 0
    p = {k: v.double() for k, v in parts.items()}
    delta = (p["hada_w1_a"] @ p["hada_w1_b"]) * (p["hada_w2_a"] @ p["hada_w2_b"]) * 1.5 / 3
    got = module_of(load(out), "denoiser", path).weight.double()
    torch.testing.assert_close(got, layer.weight.double() + 0.7 * delta, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_lycoris_on_fused_layers_merges_into_what_the_adapters_compute(
    family, tmp_path, kit_folders
):
    """A LoKr (DoRA) file of FLUX.1 / SD3, one module per original fused layer, baked into the
    transformer: each diffusers weight equals the adapted model's (base + its rows of the
    module's change, library/networks/lycoris_fused.py)."""
    from safetensors.torch import save_file

    from library.networks.lycoris.spec import LycorisSpec
    from library.networks.lycoris_fused import LycorisPart, module_layers

    base_dir = model_dir(family, kit_folders)
    components = load(base_dir)
    plain = {k: v.clone() for k, v in components.denoiser.state_dict().items()}
    spec = LycorisSpec(algo="lokr", dim=2, alpha=1.0, factor=2, dora_wd=True)
    components.family.apply_lycoris(components.denoiser, "unet", spec, "full")
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in module_layers(components.denoiser).values():
            for param in layer.adapter_parameters():
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    tensors = components.family.lora_tensors({"lora_unet": components.denoiser})
    path = tmp_path / "lokr.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    out = tmp_path / "merged"
    assert run_tool("merge", "--model", base_dir, "--loras", path, "--output_dir", out) == 0
    merged = load(out).denoiser.state_dict()
    checked = 0
    with torch.no_grad():
        for name, module in components.denoiser.named_modules():
            if not isinstance(module, LycorisPart):
                continue
            change = module._shared.weight_change()
            if getattr(module._shared.base_layer, "swapped", False):
                half = change.shape[0] // 2
                change = torch.cat([change[half:], change[:half]])
            want = plain[f"{name}.weight"] + change[module.rows[0] : module.rows[1]]
            torch.testing.assert_close(merged[f"{name}.weight"], want, rtol=1e-5, atol=2e-6)
            checked += 1
    assert checked > 10
