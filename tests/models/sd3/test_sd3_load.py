"""Loading SD3 / SD3.5 offline: which models the SD3 loader claims, Stability's single file
(text encoders inside or beside it; bf16, fp8; other layouts) against the in-memory build of the
same seed, and one-line errors naming what to fix. (A folder against diffusers' own pipeline, and
each variant's float32 all-in-one file against its folder: the conformance suite,
tests/conformance.)"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.sd3 import shapes
from library.models.families.sd3.original_keys import TEXT_ENCODER_PREFIXES, VAE_PREFIX
from library.models.families.sd3.spec import SPEC, claims_sd3
from library.models.families.spec_loader import load_spec
from tests.kits.scaled_fp8 import scaled
from tests.kits.sd3 import tiny_shapes
from tests.kits.sd3.tiny import build_tiny_sd3_components
from tests.kits.sd3.tiny_files import write_tiny_sd3_files, write_tiny_sd3_folder

VARIANT = "sd3.5-medium"
# how these tests name each part -> its subfolder (build_tiny_sd3_components' name)
PARTS = {
    "transformer": "transformer",
    "vae": "vae",
    "clip_l": "text_encoder",
    "clip_g": "text_encoder_2",
    "t5": "text_encoder_3",
}
FLOW_FILES = ("clip_l", "clip_g", "t5xxl")


@pytest.fixture(scope="module")
def folder(kit_folders) -> Path:
    """The kit's tiny folder of VARIANT (seed 0), the session's: read only."""
    return kit_folders("sd3", VARIANT)


@pytest.fixture(scope="module")
def inside(tmp_path_factory) -> dict[str, Path]:
    """The model file with all three text encoders inside (bf16)."""
    return write_tiny_sd3_files(
        tmp_path_factory.mktemp("inside"), VARIANT, 0, text_encoders_inside=True
    )


@pytest.fixture(scope="module")
def separate(tmp_path_factory) -> dict[str, Path]:
    """The model file (MMDiT + VAE) with clip_l, clip_g, t5xxl beside it (bf16)."""
    return write_tiny_sd3_files(
        tmp_path_factory.mktemp("separate"), VARIANT, 0, text_encoders_inside=False
    )


@pytest.fixture(scope="module")
def built_modules() -> dict[str, torch.nn.Module]:
    """The modules the files were written from, by the tests' names."""
    parts = build_tiny_sd3_components(VARIANT, 0)
    return {field: parts[name] for field, name in PARTS.items()}


@pytest.fixture(scope="module")
def built(built_modules) -> dict[str, dict[str, torch.Tensor]]:
    """Their state dicts."""
    return {field: module.state_dict() for field, module in built_modules.items()}


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def section(path: Path, files: dict[str, Path] | None = None, vae=None, **flow_keys):
    """ModelSection and FlowSection for ``path``; with ``files``: its tokenizer folders and the
    text-encoder files it has, each replaceable (None: unset) through ``flow_keys``."""
    model = {"pretrained_model_name_or_path": str(path)}
    flow: dict = {}
    if files is not None:
        model["tokenizer_path"] = str(files["tokenizer"])
        flow = {k: str(files[k]) for k in FLOW_FILES if k in files}
        flow["t5_tokenizer_path"] = str(files["t5_tokenizer"])
    if vae is not None:
        model["vae"] = str(vae)
    flow.update({k: (None if v is None else str(v)) for k, v in flow_keys.items()})
    return ModelSection(**model), FlowSection(**flow)


def load(
    path: Path, files=None, weight_dtype=torch.float32, vae_dtype=torch.float32, vae=None, **flow
):
    """The loaded model: its modules by the tests' names, its variant, model_dir, T5 tokenizer."""
    model, flow_section = section(path, files, vae, **flow)
    loaded = load_spec(SPEC, model, flow_section, weight_dtype, vae_dtype)
    return SimpleNamespace(
        **{field: loaded.modules[sub] for field, sub in PARTS.items()}, variant=loaded.facts,
        model_dir=loaded.model_dir, t5_tokenizer=loaded.tokenizers["tokenizer_3"],
    )  # fmt: skip


def modules(parts) -> dict[str, torch.nn.Module]:
    return {field: getattr(parts, field) for field in PARTS}


def assert_state(module: torch.nn.Module, want: dict[str, torch.Tensor]) -> None:
    got = module.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key


def stored(want: dict[str, torch.Tensor], dtype=torch.float32, storage=torch.bfloat16):
    """``want`` after storage in ``storage`` and loading in ``dtype``."""
    return {k: v.to(storage).to(dtype) for k, v in want.items()}


def config_of(module: torch.nn.Module) -> dict:
    """A module's config as plain JSON values, without the how-it-was-saved keys."""
    config = module.config
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    skip = ("transformers_version", "dtype", "torch_dtype", "architectures")
    return json.loads(
        json.dumps({k: v for k, v in config.items() if not k.startswith("_") and k not in skip})
    )


def resave(
    src: Path, dst: Path, rename=lambda k: k, cast=lambda k, v: v, extra=None, keep=lambda k: True
) -> Path:
    """``src`` rewritten: keys kept and renamed, tensors recast, ``extra`` tensors added."""
    state = {rename(k): cast(k, v) for k, v in load_file(str(src)).items() if keep(k)}
    save_file({**state, **(extra or {})}, str(dst))
    return dst


def error(path: Path, files=None, vae=None, **flow) -> str:
    with pytest.raises(ModelError) as info:
        load(path, files, vae=vae, **flow)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- claims ---------------------------------------------------------------------------------


def test_claims_sd3_folders_and_model_files(
    folder, inside, separate, tmp_path, tiny_model_dir, tiny_sdxl_model_dir
):
    from library.models.families.flux.load import claims_flux
    from library.models.families.sd.family import SD1
    from library.saving.checkpoint_export import write_single_file
    from tests.kits.flux.tiny_files import (
        write_tiny_flux_files,
        write_tiny_flux_folder,
    )
    from tests.kits.sd.tiny import build_tiny_components

    def claims(path) -> bool:
        return claims_sd3(*section(Path(path)))

    diffusers_file = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    ours = (folder, inside["model"], separate["model"], diffusers_file)
    assert all(claims(path) for path in ours)
    assert not any(claims_flux(*section(Path(path))) for path in ours)  # nor FLUX.1's loader

    flux_folder = write_tiny_flux_folder(tmp_path / "flux", "dev", 0)
    flux_files = write_tiny_flux_files(tmp_path / "flux-files", "dev", 0)
    sd = build_tiny_components("sd1")
    sd_file = write_single_file(
        tmp_path / "sd1.safetensors", sd["unet"], sd["vae"], [sd["text_encoder"]], SD1,
        torch.float32,
    )  # fmt: skip
    # A damaged SD3 file is SD3's to report, by the key names its header still shows; a header
    # cut before any of them tells nothing.
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(inside["model"].read_bytes()[:-100])
    assert claims(truncated) and not claims_flux(*section(truncated))
    header_cut = tmp_path / "header-cut.safetensors"
    header_cut.write_bytes(inside["model"].read_bytes()[:1000])
    flux_cut = tmp_path / "flux-cut.safetensors"
    flux_cut.write_bytes(flux_files["transformer"].read_bytes()[:-100])
    others = (
        flux_folder, flux_files["transformer"], flux_files["ae"], tiny_model_dir,
        tiny_sdxl_model_dir, sd_file,
        separate["clip_g"], separate["t5xxl"], header_cut, flux_cut, tmp_path / "missing",
        tmp_path / "missing.safetensors",
    )  # fmt: skip
    for other in others:
        assert not claims(other), other


def test_claims_reads_only_headers(folder, inside, monkeypatch):
    def no_reading(*args, **kwargs):
        raise AssertionError("claims_sd3 read weights")

    monkeypatch.setattr(CheckpointFile, "tensor", no_reading)
    monkeypatch.setattr("safetensors.torch.load_file", no_reading)
    assert claims_sd3(*section(inside["model"])) and claims_sd3(*section(folder))


# --- single files ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["inside", "separate"])
def test_bf16_files_hold_the_built_weights(where, inside, separate, built, built_modules):
    files = inside if where == "inside" else separate
    parts = load(files["model"], files, weight_dtype=torch.bfloat16)
    assert parts.model_dir == files["model"].absolute() and parts.variant == VARIANT
    for field, module in modules(parts).items():
        dtype = torch.float32 if field == "vae" else torch.bfloat16  # the VAE: bf16 in the file
        assert_state(module, stored(built[field], dtype))
        assert not module.training and not any(p.requires_grad for p in module.parameters())
        assert config_of(module) == config_of(built_modules[field]), field  # stored configs
    assert parts.t5.shared.weight is parts.t5.encoder.embed_tokens.weight
    # Split fused projections (q|k|v) are copies: each parameter owns its memory.
    storages = [p.untyped_storage().data_ptr() for p in parts.transformer.parameters()]
    assert len(set(storages)) == len(storages)


def test_fp8_files_load_within_fp8_rounding(tmp_path, built):
    files = write_tiny_sd3_files(tmp_path, VARIANT, 0, text_encoders_inside=True, fp8=True)
    parts = modules(load(files["model"], files))
    changed = 0
    for field, module in parts.items():
        # Matrices of the MMDiT and T5 in fp8, the rest in bf16.
        fp8 = field in ("transformer", "t5")
        want = {
            k: v.to(torch.float8_e4m3fn if fp8 and v.dim() >= 2 else torch.bfloat16).float()
            for k, v in built[field].items()
        }
        assert_state(module, want)
        changed += sum(not torch.equal(want[k], v) for k, v in built[field].items())
    assert changed  # fp8 storage did round


def test_a_scaled_fp8_t5xxl_loads_its_dequantized_weights(separate, tmp_path):
    """Comfy-Org's t5xxl_fp8_e4m3fn_scaled.safetensors (the scaled_fp8 marker, scale_weight and
    scale_input beside each fp8 matrix) as t5xxl: each matrix is its fp8 values times its
    scale, the other tensors as stored."""
    stored_tensors, want = scaled(load_file(str(separate["t5xxl"])), "scaled_fp8")
    path = tmp_path / "t5xxl_fp8_e4m3fn_scaled.safetensors"
    save_file(stored_tensors, str(path))
    want = {k: v.float() for k, v in want.items()}
    embed = want.get("shared.weight", want.get("encoder.embed_tokens.weight"))
    want |= {"shared.weight": embed, "encoder.embed_tokens.weight": embed}
    assert_state(load(separate["model"], separate, t5xxl=path).t5, want)


def test_flow_files_replace_the_ones_inside(inside, tmp_path):
    """A [flow] clip_l / clip_g / t5xxl file wins over the model file's own encoder."""
    other = write_tiny_sd3_files(
        tmp_path, VARIANT, 7, text_encoders_inside=False, dtype=torch.float32
    )
    parts = load(inside["model"], inside, clip_g=other["clip_g"], t5xxl=other["t5xxl"])
    seven = build_tiny_sd3_components(VARIANT, 7)
    zero = build_tiny_sd3_components(VARIANT, 0)
    assert_state(parts.clip_g, seven["text_encoder_2"].state_dict())
    assert_state(parts.t5, seven["text_encoder_3"].state_dict())
    assert_state(parts.clip_l, stored(zero["text_encoder"].state_dict()))


def test_released_clip_l_without_projection_and_flat_names(separate, built, tmp_path):
    """SD3's released clip_l.safetensors has no text_projection.weight: the projection is the
    identity. A file in transformers 5's flat names (no text_model.) loads the same."""
    clip_l = resave(
        separate["clip_l"], tmp_path / "clip_l.safetensors",
        rename=lambda k: k.removeprefix("text_model."),
        keep=lambda k: k != "text_projection.weight",
    )  # fmt: skip
    parts = load(separate["model"], separate, clip_l=clip_l)
    want = stored(built["clip_l"])
    eye = torch.eye(tiny_shapes.TINY_CLIP_L_WIDTH)
    assert_state(parts.clip_l, {**want, "text_projection.weight": eye})
    # CLIP-G keeps its projection: without it the file does not fit.
    clip_g = resave(
        separate["clip_g"],
        tmp_path / "clip_g.safetensors",
        keep=lambda k: k != "text_projection.weight",
    )
    message = error(separate["model"], separate, clip_g=clip_g)
    assert f"clip_g = {clip_g}" in message and "text_projection.weight" in message


def test_other_layouts(folder, separate, built, tmp_path):
    """The MMDiT without the model.diffusion_model. prefix (the VAE then from [model] vae in
    diffusers' names) and diffusers' transformer file; text encoders cut out of a full
    checkpoint with their text_encoders.* prefix; T5 with its embedding under the other name."""
    bare = resave(
        separate["model"], tmp_path / "bare.safetensors",
        rename=lambda k: k.removeprefix("model.diffusion_model."),
        keep=lambda k: not k.startswith(VAE_PREFIX),
    )  # fmt: skip
    vae_file = folder / "vae" / "diffusion_pytorch_model.safetensors"  # float32, diffusers names
    diffusers_file = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    prefixed_clip = resave(
        separate["clip_l"], tmp_path / "clip_l.safetensors",
        rename=lambda k: TEXT_ENCODER_PREFIXES["clip_l"] + k,
    )  # fmt: skip
    t5_alias = resave(
        separate["t5xxl"], tmp_path / "t5.safetensors",
        rename=lambda k: "encoder.embed_tokens.weight" if k == "shared.weight" else k,
    )  # fmt: skip
    by_bare = load(bare, separate, vae=vae_file, clip_l=prefixed_clip, t5xxl=t5_alias)
    assert_state(by_bare.transformer, stored(built["transformer"]))
    assert_state(by_bare.vae, built["vae"])
    assert_state(by_bare.clip_l, stored(built["clip_l"]))
    assert_state(by_bare.t5, stored(built["t5"]))
    by_diffusers = load(diffusers_file, separate, vae=vae_file)
    assert by_diffusers.variant == VARIANT
    assert_state(by_diffusers.transformer, built["transformer"])


def test_vae_option(separate, built, tmp_path):
    """[model] vae is used instead of the one inside: an LDM-named file with the
    first_stage_model. prefix, or a diffusers VAE folder."""
    other = write_tiny_sd3_files(
        tmp_path / "other", VARIANT, 5, text_encoders_inside=True, dtype=torch.float32
    )
    vae_only = resave(
        other["model"], tmp_path / "vae.safetensors", keep=lambda k: k.startswith(VAE_PREFIX)
    )
    five = build_tiny_sd3_components(VARIANT, 5)["vae"].state_dict()
    assert_state(load(separate["model"], separate, vae=vae_only).vae, five)
    folder = write_tiny_sd3_folder(tmp_path / "folder", VARIANT, 5)
    parts = load(separate["model"], separate, vae=folder / "vae")
    assert_state(parts.vae, five)
    assert parts.vae.config.shift_factor == shapes.vae_config()["shift_factor"]


def test_files_without_stored_configs(tmp_path, built, built_modules, caplog):
    """Sizes come from the shapes. CLIP's head count does not show in any shape and is said to
    be a guess; with qk norms the transformer's heads show."""
    files = write_tiny_sd3_files(
        tmp_path, VARIANT, 0, text_encoders_inside=True, config_metadata=False
    )
    with caplog.at_level(logging.WARNING):
        parts = load(files["model"], files, weight_dtype=torch.bfloat16)
    for field in ("transformer", "vae", "t5"):
        got, want = config_of(getattr(parts, field)), config_of(built_modules[field])
        for config in (got, want):
            config.pop("sample_size", None)  # not in the weights
        assert got == want, field
    for field, width in (
        ("clip_l", tiny_shapes.TINY_CLIP_L_WIDTH),
        ("clip_g", tiny_shapes.TINY_CLIP_G_WIDTH),
    ):
        config = getattr(parts, field).config
        assert (config.hidden_size, config.projection_dim) == (width, width)
    assert "guessed num_attention_heads" in caplog.text
    assert_state(parts.transformer, stored(built["transformer"], torch.bfloat16))


# --- errors ---------------------------------------------------------------------------------


@pytest.fixture
def no_weights_read(monkeypatch):
    """Every problem below is found before any weight is read."""

    def refuse(self, key):
        raise AssertionError(f"read {key} before the files were checked")

    monkeypatch.setattr(CheckpointFile, "tensor", refuse)


def test_missing_flow_key(separate, no_weights_read):
    message = error(separate["model"], separate, clip_g=None)
    assert "clip_g = " in message and "[flow]" in message and "CLIP-G" in message
    assert separate["model"].name in message


def test_missing_t5xxl_file(separate, tmp_path, no_weights_read):
    missing = tmp_path / "t5xxl_fp16.safetensors"
    message = error(separate["model"], separate, t5xxl=missing)
    assert f"t5xxl = {missing} is not a file" in message and "[flow]" in message


def test_truncated_files(inside, separate, tmp_path, no_weights_read):
    cut = tmp_path / "clip_g.safetensors"
    cut.write_bytes(separate["clip_g"].read_bytes()[:-100])
    message = error(separate["model"], separate, clip_g=cut)
    assert (
        message.startswith("clip_g: ") and str(cut) in message and "corrupt or truncated" in message
    )
    model = tmp_path / "sd3.5_medium.safetensors"
    model.write_bytes(inside["model"].read_bytes()[:-100])
    message = error(model, inside)
    assert (
        message.startswith("pretrained_model_name_or_path: ") and "corrupt or truncated" in message
    )


def test_wrong_files(separate, tiny_model_dir, tmp_path, no_weights_read):
    message = error(separate["model"], separate, clip_l=separate["t5xxl"])
    assert f"clip_l = {separate['t5xxl']}" in message and "a T5 encoder" in message
    # A CLIP-L where CLIP-G belongs: it builds, but its widths do not fit the transformer.
    message = error(separate["model"], separate, clip_g=separate["clip_l"])
    assert "do not fit" in message and "clip_g" in message
    sd_vae = tiny_model_dir / "vae" / "diffusion_pytorch_model.safetensors"
    message = error(separate["model"], separate, vae=sd_vae)
    assert f"vae = {sd_vae}" in message and "4 channels" in message and "[model]" in message
    flux = tmp_path / "flux1-dev.safetensors"
    save_file({"img_in.weight": torch.zeros(2, 2)}, str(flux))
    message = error(flux, separate)
    assert f"{flux} holds no SD3" in message and "pretrained_model_name_or_path" in message
    ckpt = tmp_path / "sd3.5_medium.ckpt"
    ckpt.write_bytes(b"")
    assert "read as .safetensors only" in error(ckpt, separate)


def test_model_file_without_vae(separate, tmp_path, no_weights_read):
    no_vae = resave(
        separate["model"],
        tmp_path / "mmdit.safetensors",
        keep=lambda k: not k.startswith(VAE_PREFIX),
    )
    message = error(no_vae, separate)
    assert str(no_vae) in message and "set vae = " in message and "[model]" in message
    missing = tmp_path / "vae.safetensors"
    message = error(no_vae, separate, vae=missing)
    assert f"vae = {missing} is not a file" in message and "[model]" in message


def test_missing_t5_tokenizer(inside, tmp_path, empty_hub_cache, no_weights_read):
    message = error(inside["model"], inside, t5_tokenizer_path=None)
    assert "t5_tokenizer_path" in message and "nothing is downloaded" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    message = error(inside["model"], inside, t5_tokenizer_path=empty)
    assert f"t5_tokenizer_path {empty}" in message and "tokenizer_3/" in message


def test_t5_tokenizer_from_an_sd3_folder_and_the_hub_cache(inside, folder, empty_hub_cache):
    parts = load(inside["model"], inside, t5_tokenizer_path=folder)
    assert Path(parts.t5_tokenizer.name_or_path) == folder / "tokenizer_3"
    repo = empty_hub_cache / "models--stabilityai--stable-diffusion-3.5-medium"
    shutil.copytree(inside["t5_tokenizer"], repo / "snapshots" / "abc123" / "tokenizer_3")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    parts = load(inside["model"], inside, t5_tokenizer_path=None)
    assert Path(parts.t5_tokenizer.name_or_path) == repo / "snapshots" / "abc123" / "tokenizer_3"


@pytest.mark.parametrize("sub", ["text_encoder_3", "tokenizer_3", "transformer"])
def test_folder_missing_a_part(folder, tmp_path, sub):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shutil.rmtree(broken / sub)
    message = error(broken)
    assert f"lacks the {sub}/ subfolder" in message and str(broken) in message


def test_folder_with_truncated_clip_g_fails_before_loading(folder, tmp_path, monkeypatch):
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


def test_folder_of_another_sd3_pipeline(folder, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    index = json.loads((other / "model_index.json").read_text())
    name = "StableDiffusion3ControlNetPipeline"
    (other / "model_index.json").write_text(json.dumps({**index, "_class_name": name}))
    with pytest.raises(ModelError, match=f"holds a {name}; only text-to-image SD3"):
        claims_sd3(*section(other))  # SD3's refusal, while the plan is made
    assert name in error(other)


# --- full size, on the meta device ----------------------------------------------------------


def test_full_size_files_plan_the_published_configs(tmp_path):
    """Shapes of the full-size parts (on the meta device, as Stability names them in one file)
    give back exactly the SD3 configs, with nothing guessed; the released clip_l without its
    projection gets the identity."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from library.models import original_names as names
    from library.models.families.sd3.original_keys import (
        ORIGINAL_PREFIX,
        ae_to_original,
        detect_sd3,
        transformer_to_original,
    )
    from library.models.families.sd3.spec import check_widths
    from library.models.families.spec_loader import plan_main

    with init_empty_weights():
        clip_l = CLIPTextModelWithProjection(CLIPTextConfig(**shapes.clip_l_config()))
        clip_g = CLIPTextModelWithProjection(CLIPTextConfig(**shapes.clip_g_config()))
        t5 = T5EncoderModel(T5Config(**shapes.t5_xxl_config()))
        vae = AutoencoderKL(**shapes.vae_config())
    encoders = {
        "clip_l": names.with_text_model_prefix(clip_l.state_dict()),
        "clip_g": names.with_text_model_prefix(clip_g.state_dict()),
        "t5xxl": dict(t5.state_dict()),
    }
    del encoders["clip_l"]["text_projection.weight"]  # as in SD3's released clip_l
    del encoders["t5xxl"]["encoder.embed_tokens.weight"]  # tied to shared.weight
    inside = {
        TEXT_ENCODER_PREFIXES[key] + k: v
        for key, state in encoders.items()
        for k, v in state.items()
    }
    inside |= {VAE_PREFIX + k: v for k, v in ae_to_original(vae.state_dict()).items()}
    for variant in shapes.VARIANTS:
        with torch.device("meta"):  # buffers too: the position table is not computed
            mmdit = SD3Transformer2DModel(**shapes.transformer_config(variant))
        original = {
            ORIGINAL_PREFIX + k: v for k, v in transformer_to_original(mmdit.state_dict()).items()
        }
        file = CheckpointFile(tmp_path / "meta.safetensors", tensors={**original, **inside})
        assert detect_sd3(file.keys()) == ("original", ORIGINAL_PREFIX)
        transformer = plan_main(SPEC, file)
        assert transformer.config == shapes.transformer_config(variant)
        # built for the plan with its buffers on the meta device: the position table the file
        # holds is not computed (0.9 GB in float32 for 3.5 Medium)
        built = transformer.build(transformer.config)
        assert built.pos_embed.pos_embed.device.type == "meta"
        plans = [SPEC.by_key(key).file.inside(file) for key in FLOW_FILES]
        check_widths(file.path, transformer.config, *((p.where, p.config) for p in plans))
    configs = [shapes.clip_l_config(), shapes.clip_g_config(), shapes.t5_xxl_config()]
    assert [plan.config for plan in plans] == configs
    assert SPEC.by_key("vae").file.inside(file).config == shapes.vae_config()
