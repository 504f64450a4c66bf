"""Loading FLUX.1 offline: which models the Flux loader claims, a diffusers folder against
diffusers' own FluxPipeline.from_pretrained, single files (bf16, fp8, other layouts) against the
folder of the same seed, and one-line errors naming what to fix."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.flux import shapes
from library.models.families.flux.load import claims_flux, load_flux
from library.models.families.flux.original_keys import ORIGINAL_PREFIX
from tests.kits.flux import tiny_shapes
from tests.kits.flux.tiny import build_tiny_flux_components
from tests.kits.flux.tiny_files import write_tiny_flux_files
from tests.kits.scaled_fp8 import description, scaled

PARTS = ("denoiser", "vae", "clip_l", "t5")


@pytest.fixture(scope="module")
def folder(kit_folders) -> Path:
    """The session's tiny kit folder (flux dev, seed 0): read only."""
    return kit_folders("flux", "dev")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return write_tiny_flux_files(tmp_path_factory.mktemp("files"), "dev", 0)


@pytest.fixture(scope="module")
def fp8_files(tmp_path_factory) -> dict[str, Path]:
    return write_tiny_flux_files(tmp_path_factory.mktemp("fp8"), "dev", 0, fp8=True)


@pytest.fixture(scope="module")
def pipeline(folder):
    """diffusers' own reading of the folder: the reference for ours."""
    from diffusers import FluxPipeline

    return FluxPipeline.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def folder_parts(folder):
    """The folder loaded in float32, by part name."""
    return modules(load(folder))


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def section(path: Path, files: dict[str, Path] | None = None, **flow_keys):
    """ModelSection and FlowSection for ``path``; with ``files``: its tokenizer and component
    files, each replaceable (None: unset) through ``flow_keys``."""
    model = {"pretrained_model_name_or_path": str(path)}
    flow: dict = {}
    if files is not None:
        model["tokenizer_path"] = str(files["tokenizer"])
        flow = {k: str(files[k]) for k in ("clip_l", "t5xxl", "ae")}
        flow["t5_tokenizer_path"] = str(files["t5_tokenizer"])
    flow.update({k: (None if v is None else str(v)) for k, v in flow_keys.items()})
    return ModelSection(**model), FlowSection(**flow)


def load(path: Path, files=None, weight_dtype=torch.float32, vae_dtype=torch.float32, **flow):
    model, flow_section = section(path, files, **flow)
    return load_flux(model, flow_section, weight_dtype, vae_dtype)


def modules(components) -> dict[str, torch.nn.Module]:
    clip_l, t5 = components.text_encoders
    return dict(zip(PARTS, (components.denoiser, components.vae, clip_l, t5), strict=True))


def assert_state(module: torch.nn.Module, want: dict[str, torch.Tensor]) -> None:
    got = module.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key


def config_of(module: torch.nn.Module) -> dict:
    """A module's config as plain JSON values, without the how-it-was-saved keys."""
    config = module.config
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    skip = ("transformers_version", "dtype", "torch_dtype", "architectures")
    return json.loads(
        json.dumps({k: v for k, v in config.items() if not k.startswith("_") and k not in skip})
    )


def resave(src: Path, dst: Path, rename=lambda k: k, cast=lambda k, v: v, extra=None) -> Path:
    """``src`` rewritten: keys renamed, tensors recast, ``extra`` tensors added."""
    state = {rename(k): cast(k, v) for k, v in load_file(str(src)).items()}
    save_file({**state, **(extra or {})}, str(dst))
    return dst


def error(path: Path, files=None, **flow) -> str:
    with pytest.raises(ModelError) as info:
        load(path, files, **flow)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- claims ---------------------------------------------------------------------------------


def test_claims_flux_folders_and_transformer_files(folder, files, tmp_path, tiny_model_dir):
    from library.models.families.sd.family import SD1
    from library.saving.checkpoint_export import write_single_file
    from tests.kits.sd.tiny import build_tiny_components

    def claims(path) -> bool:
        return claims_flux(*section(Path(path)))

    prefixed = resave(
        files["transformer"], tmp_path / "comfy.safetensors", lambda k: ORIGINAL_PREFIX + k
    )
    diffusers_file = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    assert claims(folder) and claims(files["transformer"]) and claims(prefixed)
    assert claims(diffusers_file)
    sd = build_tiny_components("sd1")
    sd_file = write_single_file(
        tmp_path / "sd1.safetensors", sd["unet"], sd["vae"], [sd["text_encoder"]], SD1,
        torch.float32,
    )  # fmt: skip
    # A damaged FLUX.1 file is FLUX.1's to report, by the key names its header still shows.
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(files["transformer"].read_bytes()[:1000])
    assert claims(truncated)
    sd_cut = tmp_path / "sd-cut.safetensors"
    sd_cut.write_bytes(sd_file.read_bytes()[:1000])
    for other in (tiny_model_dir, sd_file, files["clip_l"], files["ae"], sd_cut):
        assert not claims(other), other
    assert not claims(tmp_path / "missing")
    assert not claims(tmp_path / "missing.safetensors")


def test_claims_reads_only_headers(folder, files, monkeypatch):
    def no_reading(*args, **kwargs):
        raise AssertionError("claims_flux read weights")

    monkeypatch.setattr(CheckpointFile, "tensor", no_reading)
    monkeypatch.setattr("safetensors.torch.load_file", no_reading)
    assert claims_flux(*section(files["transformer"])) and claims_flux(*section(folder))


# --- a diffusers folder ---------------------------------------------------------------------


def test_folder_components(folder):
    from transformers import CLIPTokenizer, T5TokenizerFast

    from library.training.objectives import FlowMatchingObjective

    parts = load(folder)
    assert parts.model_dir == folder.absolute() and not parts.is_single_file
    assert parts.family.variant == "dev" and isinstance(parts.objective, FlowMatchingObjective)
    clip_tokenizer, t5_tokenizer = parts.tokenizers
    assert isinstance(clip_tokenizer, CLIPTokenizer) and isinstance(t5_tokenizer, T5TokenizerFast)
    # The tokenizers fit their encoders: T5 ends with </s> (1), CLIP pads to 77.
    assert t5_tokenizer("a cat").input_ids[-1] == 1
    assert len(clip_tokenizer("a cat", padding="max_length").input_ids) == 77


# --- single files ---------------------------------------------------------------------------


def test_bf16_files_hold_the_folder_weights(files, folder_parts):
    parts = load(files["transformer"], files, weight_dtype=torch.bfloat16)
    assert parts.model_dir == files["transformer"].absolute() and parts.is_single_file
    assert parts.family.variant == "dev"
    for name, module in modules(parts).items():
        dtype = torch.float32 if name == "vae" else torch.bfloat16
        # The files hold bf16: the AE is stored in bf16 and loaded in float32.
        want = {
            k: v.to(torch.bfloat16).to(dtype) for k, v in folder_parts[name].state_dict().items()
        }
        assert_state(module, want)
        assert not module.training and not any(p.requires_grad for p in module.parameters())
        assert config_of(module) == config_of(folder_parts[name]), name  # stored configs
    t5 = parts.text_encoders[1]
    assert t5.shared.weight is t5.encoder.embed_tokens.weight
    # Split fused projections (q|k|v, linear1) are copies: each parameter owns its memory.
    storages = [p.untyped_storage().data_ptr() for p in parts.denoiser.parameters()]
    assert len(set(storages)) == len(storages)


def _fp8_round_trip(name: str, key: str, value: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """What a tensor of the folder becomes after storage in an fp8 file: matrices of the
    transformer and T5 in ``fp8``, everything else in bf16."""
    stored = fp8 if name in ("denoiser", "t5") and value.dim() >= 2 else torch.bfloat16
    return value.to(stored).to(torch.float32)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3fn", "e5m2"])
def test_fp8_files_load_within_fp8_rounding(fp8_files, folder_parts, tmp_path, fp8):
    files = dict(fp8_files)
    with safe_open(str(files["transformer"]), "pt") as handle:
        stored = {handle.get_slice(k).get_dtype() for k in handle.keys()}  # noqa: SIM118
    assert stored == {"F8_E4M3", "BF16"}
    if fp8 is torch.float8_e5m2:  # the other fp8 format, from the bf16 values

        def cast(key, value):
            return value.to(torch.float32).to(fp8) if value.dtype == torch.float8_e4m3fn else value

        for role in ("transformer", "t5xxl"):
            files[role] = resave(files[role], tmp_path / f"{role}.safetensors", cast=cast)
    parts = modules(load(files["transformer"], files))
    changed = 0
    for name, module in parts.items():
        reference = folder_parts[name].state_dict()
        want = {k: _fp8_round_trip(name, k, v, torch.float8_e4m3fn) for k, v in reference.items()}
        if fp8 is torch.float8_e5m2:
            want = {
                k: v.to(fp8).to(torch.float32) if name in ("denoiser", "t5") and v.dim() >= 2 else v
                for k, v in want.items()
            }
        assert_state(module, want)
        changed += sum(not torch.equal(want[k], reference[k]) for k in want)
    assert changed  # fp8 storage did round


def test_other_layouts_load_the_same_weights(files, folder, folder_parts, tmp_path):
    """ComfyUI's prefixed checkpoint (with other parts in it), diffusers' transformer file and
    AE file, clip_l without text_model., T5 with its embedding under the other name (or both)."""
    bf16 = {k: v.to(torch.bfloat16) for k, v in folder_parts["denoiser"].state_dict().items()}
    comfy = resave(
        files["transformer"],
        tmp_path / "comfy.safetensors",
        lambda k: ORIGINAL_PREFIX + k,
        extra={
            "text_encoders.clip_l.transformer.text_model.final_layer_norm.weight": torch.ones(4)
        },
    )
    diffusers_file = resave(
        folder / "transformer" / "diffusion_pytorch_model.safetensors",
        tmp_path / "diffusers.safetensors",
        cast=lambda k, v: v.to(torch.bfloat16),
    )
    for transformer in (comfy, diffusers_file):
        assert_state(load(transformer, files, weight_dtype=torch.bfloat16).denoiser, bf16)

    clip_flat = resave(
        files["clip_l"], tmp_path / "clip.safetensors", lambda k: k.removeprefix("text_model.")
    )
    t5_alias = resave(
        files["t5xxl"],
        tmp_path / "t5_alias.safetensors",
        lambda k: "encoder.embed_tokens.weight" if k == "shared.weight" else k,
    )
    t5_both = resave(
        files["t5xxl"],
        tmp_path / "t5_both.safetensors",
        extra={"encoder.embed_tokens.weight": load_file(str(files["t5xxl"]))["shared.weight"]},
    )
    ae_diffusers = folder / "vae" / "diffusion_pytorch_model.safetensors"
    for flow in ({"clip_l": clip_flat, "t5xxl": t5_alias, "ae": ae_diffusers}, {"t5xxl": t5_both}):
        parts = modules(load(files["transformer"], files, **flow))
        for name in ("clip_l", "t5"):
            want = {
                k: v.to(torch.bfloat16).float() for k, v in folder_parts[name].state_dict().items()
            }
            assert_state(parts[name], want)
        assert parts["t5"].shared.weight is parts["t5"].encoder.embed_tokens.weight
        if "ae" in flow:  # the diffusers file is float32
            assert_state(parts["vae"], folder_parts["vae"].state_dict())


def test_files_without_stored_configs(tmp_path, folder_parts, caplog):
    """Sizes come from the shapes. The transformer's rotary axes and CLIP's head count do not
    show in any shape: the axes guess fits the tiny model, CLIP's is said to be a guess."""
    files = write_tiny_flux_files(tmp_path, "dev", 0, config_metadata=False)
    with caplog.at_level(logging.WARNING):
        parts = modules(load(files["transformer"], files, weight_dtype=torch.bfloat16))
    for name in ("denoiser", "vae", "t5"):
        got, want = config_of(parts[name]), config_of(folder_parts[name])
        if name == "vae":  # not a property of the weights: the full-size AE's
            assert (
                got.pop("sample_size") == 1024 and want.pop("sample_size") == tiny_shapes.TINY_SIZE
            )
        assert got == want, name
    clip = parts["clip_l"].config
    assert (clip.hidden_size, clip.num_hidden_layers) == (tiny_shapes.TINY_CLIP_WIDTH, 2)
    assert clip.num_attention_heads == 12  # CLIP-L's 12 heads divide the tiny width: kept
    assert "guessed num_attention_heads=12" in caplog.text
    assert "guessed axes_dims_rope" in caplog.text


# --- errors ---------------------------------------------------------------------------------


@pytest.fixture
def no_weights_read(monkeypatch):
    """Every problem below is found before any weight is read."""

    def refuse(self, key):
        raise AssertionError(f"read {key} before the files were checked")

    monkeypatch.setattr(CheckpointFile, "tensor", refuse)


def test_missing_flow_key(files, no_weights_read):
    message = error(files["transformer"], files, clip_l=None)
    assert "clip_l = " in message and "[flow]" in message and "single transformer file" in message


def test_missing_t5xxl_file(files, tmp_path, no_weights_read):
    missing = tmp_path / "t5xxl_fp16.safetensors"
    message = error(files["transformer"], files, t5xxl=missing)
    assert f"t5xxl = {missing}" in message and "nothing is there" in message


def test_truncated_ae(files, tmp_path, no_weights_read):
    cut = tmp_path / "ae.safetensors"
    cut.write_bytes(files["ae"].read_bytes()[:-100])
    message = error(files["transformer"], files, ae=cut)
    assert message.startswith("ae: ") and str(cut) in message
    assert "corrupt or truncated" in message


def test_wrong_file_for_clip_l(files, no_weights_read):
    message = error(files["transformer"], files, clip_l=files["t5xxl"])
    assert f"clip_l = {files['t5xxl']}" in message and "a T5 encoder" in message


def test_sd_vae_given_as_ae(files, tiny_model_dir, no_weights_read):
    sd_vae = tiny_model_dir / "vae" / "diffusion_pytorch_model.safetensors"
    message = error(files["transformer"], files, ae=sd_vae)
    assert f"ae = {sd_vae}" in message and "4 channels" in message and "SD VAE" in message


def test_a_scaled_fp8_t5xxl_is_the_t5_of_its_dequantized_weights(files, tmp_path):
    """Comfy-Org's t5xxl_fp8_e4m3fn_scaled layout (the scaled_fp8 marker, scale_weight and
    scale_input beside each fp8 matrix) loads as the T5 built by hand from each matrix's fp8
    values times its scale: the same weights, the same outputs."""
    from transformers import T5EncoderModel

    stored, want = scaled(load_file(str(files["t5xxl"])), "scaled_fp8")
    path = tmp_path / "t5xxl_fp8_e4m3fn_scaled.safetensors"
    save_file(stored, str(path))
    t5 = modules(load(files["transformer"], files, t5xxl=path))["t5"]
    reference = T5EncoderModel(t5.config).eval()
    reference.load_state_dict(
        {**want, "encoder.embed_tokens.weight": want["shared.weight"]}, strict=True
    )
    assert_state(t5, reference.state_dict())
    ids = torch.randint(0, t5.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(t5(ids).last_hidden_state, reference(ids).last_hidden_state)


def test_a_comfy_quant_transformer_is_its_dequantized_weights(files, tmp_path):
    """ComfyUI's newer layout (weight_scale, input_scale and a comfy_quant description beside
    each fp8 matrix, under model.diffusion_model.) loads the weights of a file holding each
    matrix's fp8 values times its scale, computed here."""
    state = {ORIGINAL_PREFIX + k: v for k, v in load_file(str(files["transformer"])).items()}
    stored, want = scaled(state, "comfy_quant")
    quantized = tmp_path / "flux1-dev_fp8_scaled.safetensors"
    save_file(stored, str(quantized))
    by_hand = tmp_path / "flux1-dev_dequantized.safetensors"
    save_file(want, str(by_hand))
    got = modules(load(quantized, files))["denoiser"]
    assert_state(got, modules(load(by_hand, files))["denoiser"].state_dict())


def test_a_transformer_in_another_quantization_is_refused_by_name(files, tmp_path, no_weights_read):
    """A layer in a format difftune does not read (nvfp4 here) is refused before any weight is
    read, naming the key, the format and the files to use."""
    stored, _ = scaled(load_file(str(files["transformer"])), "comfy_quant")
    key = next(k for k in stored if k.endswith(".comfy_quant"))
    stored[key] = description("nvfp4")
    path = tmp_path / "flux1-dev_nvfp4.safetensors"
    save_file(stored, str(path))
    message = error(path, files)
    assert message.startswith(f"pretrained_model_name_or_path = {path}: {key} stores")
    assert "'nvfp4'" in message and "or a diffusers folder" in message
    assert "not a FLUX.1 transformer" not in message


def test_missing_t5_tokenizer(files, tmp_path, empty_hub_cache, no_weights_read):
    message = error(files["transformer"], files, t5_tokenizer_path=None)
    assert "t5_tokenizer_path" in message and "nothing is downloaded" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    message = error(files["transformer"], files, t5_tokenizer_path=empty)
    assert f"t5_tokenizer_path {empty}" in message and "tokenizer.json" in message


def test_t5_tokenizer_found_in_kohya_cache_dir_and_hub_cache(files, tmp_path, empty_hub_cache):
    kohya = tmp_path / "kohya"
    shutil.copytree(files["t5_tokenizer"], kohya / "google_t5-v1_1-xxl")
    model, flow = section(files["transformer"], files, t5_tokenizer_path=None)
    cached = model.model_copy(update={"tokenizer_cache_dir": str(kohya)})
    t5_tokenizer = load_flux(cached, flow, torch.float32, torch.float32).tokenizers[1]
    assert Path(t5_tokenizer.name_or_path) == kohya / "google_t5-v1_1-xxl"
    # The Hub cache layout: models--org--name/refs/main names the snapshot folder.
    repo = empty_hub_cache / "models--black-forest-labs--FLUX.1-dev"
    shutil.copytree(files["t5_tokenizer"], repo / "snapshots" / "abc123" / "tokenizer_2")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    t5_tokenizer = load_flux(model, flow, torch.float32, torch.float32).tokenizers[1]
    assert Path(t5_tokenizer.name_or_path) == repo / "snapshots" / "abc123" / "tokenizer_2"
    assert t5_tokenizer("a").input_ids[-1] == 1


def test_spiece_model_without_tokenizer_json(files, tmp_path, no_weights_read):
    import importlib.util

    if importlib.util.find_spec("sentencepiece") is not None:
        pytest.skip("sentencepiece is installed: spiece.model can be read")
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "spiece.model").write_bytes(b"\x00")
    message = error(files["transformer"], files, t5_tokenizer_path=folder)
    assert "spiece.model" in message and "sentencepiece" in message and "tokenizer.json" in message


def test_clip_tokenizer_given_as_t5_tokenizer(files, tmp_path, no_weights_read):
    from transformers import CLIPTokenizer

    clip = tmp_path / "clip"  # with tokenizer.json, which the T5 check looks for
    CLIPTokenizer.from_pretrained(str(files["tokenizer"])).save_pretrained(str(clip))
    message = error(files["transformer"], files, t5_tokenizer_path=clip)
    assert f"t5_tokenizer_path: the tokenizer in {clip} does not fit T5-XXL" in message
    assert "it is a CLIP tokenizer" in message


@pytest.mark.parametrize("sub", ["text_encoder_2", "tokenizer_2", "transformer"])
def test_folder_missing_a_part(folder, tmp_path, sub):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shutil.rmtree(broken / sub)
    message = error(broken)
    assert f"lacks the {sub}/ subfolder" in message and str(broken) in message


def test_folder_with_truncated_t5_fails_before_loading(folder, tmp_path, monkeypatch):
    from library.models.families import folder_loader

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    weights = broken / "text_encoder_2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    monkeypatch.setattr(
        folder_loader, "load_weights", lambda *a, **k: pytest.fail("loaded weights")
    )
    message = error(broken)
    assert str(weights) in message and "corrupt or truncated" in message


def test_folder_of_another_flux_pipeline(folder, tmp_path):
    fill = tmp_path / "fill"
    shutil.copytree(folder, fill)
    index = json.loads((fill / "model_index.json").read_text())
    (fill / "model_index.json").write_text(json.dumps({**index, "_class_name": "FluxFillPipeline"}))
    with pytest.raises(ModelError, match="holds a FluxFillPipeline; only text-to-image FLUX.1"):
        claims_flux(*section(fill))  # FLUX.1's refusal, while the plan is made
    assert "FluxFillPipeline" in error(fill)


def test_components_match_in_memory_build(folder_parts):
    """The folder holds build_tiny_flux_components' weights (the writer's own check)."""
    built = build_tiny_flux_components("dev", 0)
    names = {
        "denoiser": "transformer",
        "vae": "vae",
        "clip_l": "text_encoder",
        "t5": "text_encoder_2",
    }
    for name, module in folder_parts.items():
        assert_state(module, built[names[name]].state_dict())


def test_full_size_files_plan_the_published_configs(tmp_path):
    """Shapes of the full-size parts (on the meta device, as BFL / ComfyUI name them) give back
    exactly the FLUX.1 configs, with nothing guessed."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from library.models import original_names as names
    from library.models.families.flux.original_keys import ae_to_original, transformer_to_original
    from library.models.families.flux.spec import SPEC
    from library.models.families.spec_loader import plan_main

    def plan(key, state):
        return SPEC.by_key(key).file.plan(file(state))

    def file(state) -> CheckpointFile:
        return CheckpointFile(tmp_path / "meta.safetensors", tensors=dict(state))

    with init_empty_weights():
        built = {
            "dev": FluxTransformer2DModel(**shapes.transformer_config("dev")),
            "schnell": FluxTransformer2DModel(**shapes.transformer_config("schnell")),
            "clip": CLIPTextModel(CLIPTextConfig(**shapes.clip_l_config())),
            "t5": T5EncoderModel(T5Config(**shapes.t5_xxl_config())),
            "ae": AutoencoderKL(**shapes.ae_config()),
        }
    for variant in shapes.VARIANTS:
        original = file(transformer_to_original(built[variant].state_dict()))
        assert plan_main(SPEC, original).config == shapes.transformer_config(variant)
    clip_state = names.with_text_model_prefix(built["clip"].state_dict())
    assert plan("clip_l", clip_state).config == shapes.clip_l_config()
    t5_state = {
        k: v for k, v in built["t5"].state_dict().items() if not k.startswith("encoder.embed")
    }
    assert plan("t5xxl", t5_state).config == shapes.t5_xxl_config()
    ae_state = ae_to_original(built["ae"].state_dict())
    assert plan("ae", ae_state).config == shapes.ae_config()
