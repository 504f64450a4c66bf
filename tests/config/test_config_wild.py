"""Every config of the wild corpus (tests/config/wild, shaped like what real tools write) dry-runs
as written, with only its paths filled in; what difftune ignores is said, never silent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.integration.harness import reset_accelerate

WILD = Path(__file__).parent / "wild"
# args file -> the dataset file its tool passes with --dataset_config (see wild/README.md)
PAIRS = {
    "linaqruf_colab_training_config.toml": "linaqruf_colab_dataset_config.toml",
    "hollowstrawberry_colab_training_config.toml": "hollowstrawberry_colab_dataset_config.toml",
    "hollowstrawberry_colab_xl_training_config.toml": "hollowstrawberry_colab_xl_dataset_config.toml",
    "derrian_backend_config.toml": "derrian_backend_dataset.toml",
    "derrian_backend_flux1_config.toml": "derrian_backend_flux1_dataset.toml",
}
DATASET_FILES = sorted(
    p.name for p in WILD.glob("*.toml") if p.name.startswith("dataset_") or p.name in PAIRS.values()
)
ARGS_FILES = sorted(p.name for p in WILD.glob("*.toml") if p.name not in DATASET_FILES)
# Files that need a feature another issue builds: they must be refused by name, in one line.
PLANNED: dict[str, str] = {}
# Files written by Windows front ends, with their CRLF line endings kept.
CRLF_FILES = (
    "lora_scripts_flux1_lora.toml",
    "lora_scripts_sd3_lora.toml",
    "derrian_backend_flux1_config.toml",
    "derrian_backend_flux1_dataset.toml",
)


@pytest.fixture(scope="module")
def places(tmp_path_factory, tiny_model_dir, tiny_sdxl_model_dir):
    from tests.kits.flux.tiny_files import write_tiny_flux_files
    from tests.kits.sd3.tiny_files import write_tiny_sd3_files

    root = tmp_path_factory.mktemp("wild")
    flux = write_tiny_flux_files(root / "flux", "dev", seed=0)
    sd3 = write_tiny_sd3_files(root / "sd3", "sd3.5-medium", 0, text_encoders_inside=False)
    images = root / "images"
    images.mkdir()
    # larger than every min_bucket_reso in the corpus (bucket_no_upscale), and enough of them
    # for the warmup lengths the presets set
    for i in range(16):
        Image.new("RGB", (512 + 64 * (i % 2), 512), (15 * i, 90, 160)).save(images / f"img{i}.png")
        (images / f"img{i}.txt").write_text(f"sks dog, photo {i}", encoding="utf-8")
    for parent in ("train", "reg"):
        (root / parent / "10_sks dog" if parent == "train" else root / parent / "1_dog").mkdir(
            parents=True
        )
        folder = next((root / parent).iterdir())
        for i in range(2):
            Image.new("RGB", (512, 576), (20, 40 * i, 60)).save(folder / f"{parent}{i}.png")
    metadata = root / "meta.json"
    metadata.write_text(
        json.dumps({f"img{i}": {"caption": f"a photo {i}", "tags": "dog"} for i in range(4)}),
        encoding="utf-8",
    )
    prompts = root / "prompts.txt"
    prompts.write_text("a photo of sks dog --w 512 --h 512 --d 1\n", encoding="utf-8")
    return {
        "__MODEL__": str(tiny_model_dir),
        "__SDXL_MODEL__": str(tiny_sdxl_model_dir),
        "__TRAIN_DIR__": str(root / "train"),
        "__REG_DIR__": str(root / "reg"),
        "__IMAGE_DIR__": str(images),
        "__OUTPUT_DIR__": str(root / "output"),
        "__LOGGING_DIR__": str(root / "logs"),
        "__METADATA__": str(metadata),
        "__SAMPLE_PROMPTS__": str(prompts),
        "__FLUX_MODEL__": str(flux["transformer"]),
        "__FLUX_CLIP_L__": str(flux["clip_l"]),
        "__FLUX_T5XXL__": str(flux["t5xxl"]),
        "__FLUX_AE__": str(flux["ae"]),
        "__SD3_MODEL__": str(sd3["model"]),
        "__SD3_CLIP_L__": str(sd3["clip_l"]),
        "__SD3_CLIP_G__": str(sd3["clip_g"]),
        "__SD3_T5XXL__": str(sd3["t5xxl"]),
        # not placeholders of the files: the tokenizers FLUX.1 and SD3 runs need besides them
        "flux_tokenizers": (str(flux["tokenizer"]), str(flux["t5_tokenizer"])),
        "sd3_tokenizers": (str(sd3["tokenizer"]), str(sd3["t5_tokenizer"])),
    }


def _filled(name: str, places: dict, out: Path) -> Path:
    # newline="": the file's line endings (CRLF from Windows front ends) reach the loader
    with open(WILD / name, encoding="utf-8", newline="") as handle:
        text = handle.read()
    while "__DATASET_CONFIG__:" in text:
        start = text.index("__DATASET_CONFIG__:")
        end = start + len("__DATASET_CONFIG__:")
        while text[end] not in "\"'":
            end += 1
        dataset = _filled(text[start + len("__DATASET_CONFIG__:") : end], places, out)
        text = text[:start] + str(dataset) + text[end:]
    model = places["__SDXL_MODEL__"] if "xl" in name.lower() else places["__MODEL__"]
    text = text.replace("__MODEL__", model)
    for key, value in places.items():
        if key.startswith("__"):
            text = text.replace(key, value)
    path = out / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def _dry_run(config: Path, *extra: str) -> int:
    from library.cli import main

    reset_accelerate()
    try:
        return main(["--config", str(config), "--dry_run", *extra])
    finally:
        reset_accelerate()


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.integration
@pytest.mark.parametrize("name", ARGS_FILES)
def test_args_file_dry_runs_unchanged(name, places, tmp_path, capsys):
    config = _filled(name, places, tmp_path)
    extra = []
    if name in PAIRS:
        extra = ["--dataset_config", str(_filled(PAIRS[name], places, tmp_path))]
    # a dry run builds the model at its shapes: FLUX.1 and SD3 files need their tokenizers,
    # which the GUI does not write (nor does sd-scripts need them: it downloads them)
    for family in ("flux", "sd3"):
        if family in name:
            clip, t5 = places[f"{family}_tokenizers"]
            extra += ["--tokenizer_path", clip, "--t5_tokenizer_path", t5]
    if "sd3" in name:
        # the tiny SD3's position embedding holds 32 patches a side (512 px; the released models
        # 3072 px and more): its images, kept at their 512x576 by bucket_no_upscale, would not run
        extra += ["--resolution", "512"]
    code = _dry_run(config, *extra)
    out, err = capsys.readouterr()
    if name in PLANNED:
        assert code == 2 and len(_error_lines(err)) == 1 and PLANNED[name] in err, err
        return
    assert code == 0, err
    assert "difftune plan" in out and "total optimizer steps" in out
    assert "attention: torch scaled-dot-product attention" in out


@pytest.mark.integration
@pytest.mark.parametrize("name", DATASET_FILES)
def test_dataset_file_dry_runs_unchanged(name, places, tmp_path, capsys):
    dataset = _filled(name, places, tmp_path)
    config = tmp_path / "args.toml"
    config.write_text(
        f"pretrained_model_name_or_path = {json.dumps(places['__MODEL__'])}\n"
        f"dataset_config = {json.dumps(str(dataset))}\n"
        f"output_dir = {json.dumps(places['__OUTPUT_DIR__'])}\n",
        encoding="utf-8",
    )
    code = _dry_run(config)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "total optimizer steps" in out


@pytest.mark.integration
def test_ignored_keys_are_listed_in_one_warning(places, tmp_path, capsys):
    config = _filled("kohya_ss_gui_v24_sd15_lora.toml", places, tmp_path)
    assert _dry_run(config) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "not read by sd-scripts either" in line]
    assert len(warnings) == 1, err
    assert "epoch, noise_offset_type" in warnings[0] and "kohya_ss GUI" in warnings[0]


def test_gui_values_mean_what_kohya_reads(places, tmp_path):
    from library.config.loader import load_config

    config = load_config(str(_filled("kohya_ss_gui_v25_sdxl_lora.toml", places, tmp_path)))
    assert config.training.persistent_data_loader_workers is True  # written as 1
    assert config.training.full_bf16 is True
    template = load_config(str(_filled("gradients_god_sdxl_template.toml", places, tmp_path)))
    assert template.data.reg_data_dir is None and template.saving.resume is None  # ""
    assert template.model.vae is None and template.sampling.sample_prompts is None
    assert template.network.scale_weight_norms == 5
    assert any("huggingface_repo_type" in n for n in template.notices)


@pytest.mark.integration
def test_a_gui_flux_export_trains(places, tmp_path, capsys, caplog):
    """The FLUX.1 export trains on tiny files as written (only paths, tokenizers, the step count
    and the size changed); the SD-only keys the GUI writes are named in a warning."""
    config = _filled("kohya_ss_gui_v25_flux1_lora.toml", places, tmp_path)
    clip, t5 = places["flux_tokenizers"]
    from library.cli import main

    reset_accelerate()
    try:
        code = main([
            "--config", str(config), "--tokenizer_path", clip, "--t5_tokenizer_path", t5,
            "--max_train_steps", "1", "--resolution", "64", "--min_bucket_reso", "64",
            "--bucket_reso_steps", "16",
            "--sample_prompts", "", "--output_dir", str(tmp_path / "out"),
        ])  # fmt: skip
    finally:
        reset_accelerate()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "min_snr_gamma = 7.0, noise_offset = 0.05: not used by flow-matching" in caplog.text
    assert "model: FLUX.1 dev (512 T5 tokens, T5 padding masked, guidance 1)" in out
    assert (
        tmp_path / "out" / "Flux.my-super-duper-model-name-goes-here-v1.0.safetensors"
    ).is_file()


@pytest.mark.integration
def test_a_gui_sd3_export_trains(places, tmp_path, capsys, caplog, monkeypatch):
    """The SD3 export trains on tiny files as written (only paths, tokenizers, the step count
    and the size changed): the GUI's SD sampler is sampled with Euler, with a warning, as
    sd-scripts does; t5xxl_dtype and text_encoder_batch_size change nothing."""
    from library.sampling import samplers

    # the warning comes once per process: an earlier dry run of this file may have given it
    monkeypatch.setattr(samplers, "_warned_flow_samplers", set())
    config = _filled("kohya_ss_gui_v25_sd3_lora.toml", places, tmp_path)
    clip, t5 = places["sd3_tokenizers"]
    from library.cli import main

    reset_accelerate()
    try:
        code = main([
            "--config", str(config), "--tokenizer_path", clip, "--t5_tokenizer_path", t5,
            "--max_train_steps", "1", "--resolution", "64", "--min_bucket_reso", "64",
            "--bucket_reso_steps", "16", "--sample_every_n_steps", "1",
            "--output_dir", str(tmp_path / "out"),
        ])  # fmt: skip
    finally:
        reset_accelerate()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert 'sample_sampler "euler_a": a flow-matching model samples with Euler only' in caplog.text
    assert "model: SD3.5 Medium (256 T5 tokens)" in out
    assert "weighting_scheme logit_normal (mean 0, std 1), training_shift 1" in out
    assert (tmp_path / "out" / "SD3.my-super-duper-model-name-goes-here-v1.0.safetensors").is_file()
    assert list((tmp_path / "out" / "sample").glob("*.png"))


@pytest.mark.integration
def test_a_gui_lycoris_export_trains(places, tmp_path, capsys):
    """The GUI's "LyCORIS/LoHa" export (every LyCORIS option written, off or not, use_tucker
    twice) trains on the tiny SDXL model as written: LoHa with DoRA, SGM names."""
    from safetensors import safe_open

    from library.cli import main

    config = _filled("kohya_ss_gui_v25_sdxl_loha.toml", places, tmp_path)
    reset_accelerate()
    try:
        code = main([
            "--config", str(config), "--max_train_steps", "1", "--resolution", "128",
            "--min_bucket_reso", "64", "--bucket_reso_steps", "32",
            "--output_dir", str(tmp_path / "out"),
        ])  # fmt: skip
    finally:
        reset_accelerate()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "adapter: LyCORIS LoHa + DoRA, rank 8, alpha 4; kxk convs rank 4, alpha 2" in out
    with safe_open(str(tmp_path / "out" / "sdxl_loha_dora.safetensors"), "pt") as handle:
        keys = set(handle.keys())
        network_module = handle.metadata()["ss_network_module"]
    assert network_module == "lycoris.kohya"
    assert "lora_unet_input_blocks_1_0_in_layers_2.hada_w1_a" in keys
    assert any(k.endswith(".dora_scale") for k in keys)
    assert not any(k.startswith("lora_te") for k in keys)  # network_train_unet_only


def test_line_endings_and_padding_reach_the_loader_as_written(places, tmp_path):
    """CRLF from Windows front ends and the padded lines of a published template are what the
    files are about: nothing on the way (git, the placeholder filling) may drop them."""
    for name in CRLF_FILES:
        raw = (WILD / name).read_bytes()
        assert raw.count(b"\r\n") == raw.count(b"\n") > 0, name
        assert _filled(name, places, tmp_path).read_bytes().count(b"\r\n") == raw.count(b"\n")
    name = "gradients_god_flux_template.toml"
    padded = [line.endswith(" ") for line in (WILD / name).read_text("utf-8").splitlines()]
    filled = _filled(name, places, tmp_path).read_text("utf-8").splitlines()
    assert [line.endswith(" ") for line in filled] == padded and sum(padded) > len(padded) // 2


def test_front_end_keys_are_neither_sd_scripts_arguments_nor_difftune_keys():
    """A listed key is dropped with a warning: an sd-scripts argument must be classified
    instead, and a difftune key would be read by the schema, not dropped."""
    from library.config.frontend_keys import FRONTEND_ONLY_KEYS
    from library.config.overrides import key_kind
    from tests.config.kohya_arguments import KOHYA_OFF_VALUES

    assert sorted(FRONTEND_ONLY_KEYS.keys() & KOHYA_OFF_VALUES.keys()) == []
    assert [k for k in FRONTEND_ONLY_KEYS if key_kind(k) != "unknown"] == []


@pytest.mark.integration
def test_lora_scripts_preview_fields_are_ignored_in_one_warning(places, tmp_path, capsys, caplog):
    """SD-Trainer leaves its preview fields in the args file when a prompt file is given: they
    are named in one line; its sample size is read as difftune's sample_width / _height, the
    size the user set there; clip_skip = 2 (its default) is named as unused on FLUX.1."""
    from library.config.loader import load_config

    config = _filled("lora_scripts_flux1_lora.toml", places, tmp_path)
    clip, t5 = places["flux_tokenizers"]
    assert _dry_run(config, "--tokenizer_path", clip, "--t5_tokenizer_path", t5) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "not read by sd-scripts either" in line]
    assert len(warnings) == 1, err
    assert (
        "ignored randomly_choice_prompt, prompt_file, positive_prompts, negative_prompts, "
        "sample_cfg: written by lora-scripts (Akegarasu)" in warnings[0]
    )
    assert "clip_skip = 2: SD settings, not used by Flux.1" in caplog.text
    loaded = load_config(str(config))
    assert (loaded.sampling.sample_width, loaded.sampling.sample_height) == (768, 768)
    assert loaded.sampling.sample_prompts == places["__SAMPLE_PROMPTS__"]


def _train_tiny(config: Path, tokenizers: tuple[str, str], out: Path, *extra: str) -> int:
    from library.cli import main

    reset_accelerate()
    try:
        return main([
            "--config", str(config), "--tokenizer_path", tokenizers[0],
            "--t5_tokenizer_path", tokenizers[1], "--max_train_steps", "2",
            "--max_train_epochs", "", "--lr_warmup_steps", "",  # the files' own run length
            "--resolution", "64", "--min_bucket_reso", "64", "--bucket_reso_steps", "16",
            "--output_dir", str(out), *extra,
        ])  # fmt: skip
    finally:
        reset_accelerate()


@pytest.mark.integration
def test_a_lora_scripts_flux_file_trains(places, tmp_path, capsys):
    """SD-Trainer's FLUX.1 file (CRLF, top-level train_t5xxl = false, model_type = "flux")
    trains two steps on tiny files as written (paths, tokenizers, steps and size changed)."""
    from safetensors import safe_open

    config = _filled("lora_scripts_flux1_lora.toml", places, tmp_path)
    out = tmp_path / "out"
    code = _train_tiny(config, places["flux_tokenizers"], out, "--sample_prompts", "")
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "model: FLUX.1 dev (512 T5 tokens, T5 padding masked, guidance 1)" in stdout
    with safe_open(str(out / "flux_inkwash_v3.safetensors"), "pt") as handle:
        keys = set(handle.keys())
        metadata = handle.metadata()
    assert metadata["ss_network_module"] == "networks.lora_flux"
    assert metadata["ss_timestep_sampling"] == "shift"
    assert any(k.startswith("lora_unet_double_blocks_0_img_attn_qkv") for k in keys)
    assert not any(k.startswith("lora_te") for k in keys)  # network_train_unet_only


@pytest.mark.integration
def test_a_lora_scripts_sd3_file_trains(places, tmp_path, capsys):
    """SD-Trainer's SD3 file trains two steps on tiny SD3.5 Medium files as written: CLIP-L and
    CLIP-G adapters (network_train_unet_only = false) and no T5 one (train_t5xxl = false),
    154 T5 tokens, regularisation images."""
    from safetensors import safe_open

    config = _filled("lora_scripts_sd3_lora.toml", places, tmp_path)
    out = tmp_path / "out"
    code = _train_tiny(config, places["sd3_tokenizers"], out)
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "model: SD3.5 Medium (154 T5 tokens)" in stdout
    with safe_open(str(out / "sd35m_papercraft.safetensors"), "pt") as handle:
        keys = handle.keys()
    prefixes = {k.split("_", 2)[1] for k in keys if k.startswith("lora_")}
    assert prefixes == {"unet", "te1", "te2"}
