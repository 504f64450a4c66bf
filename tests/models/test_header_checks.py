"""A checkpoint's own header is believed over its weights: a file lacking tensors that the
config in its header (``difftune.config.<part>``) promises is refused as truncated, not trained
as a smaller model; an autoencoder's latent channels are checked whatever its header says. Both
before any weight is read, so the dry run finds them too."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.loader import load_components
from library.models.model_files import shapes_only

TOKENIZER = Path(__file__).parents[1] / "assets" / "tokenizer"


@pytest.fixture(autouse=True)
def no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a weight was read before the headers were checked")

    monkeypatch.setattr(CheckpointFile, "tensor", refuse)


def load(path: Path, **keys):
    """load_components on the meta device (the dry run's way)."""
    flow = {k: str(v) for k, v in keys.items() if k in FlowSection.model_fields}
    model = {k: str(v) for k, v in keys.items() if k not in flow}
    with shapes_only():
        return load_components(
            ModelSection(pretrained_model_name_or_path=str(path), **model),
            torch.float32,
            FlowSection(**flow),
        )


def error(path: Path, **keys) -> str:
    with pytest.raises(ModelError) as info:
        load(path, **keys)
    return str(info.value)


def without(src: Path, dst: Path, drop: str, keep_header: bool = True) -> Path:
    """``src`` without the tensors whose keys start with ``drop``; its header kept or not."""
    with safe_open(str(src), "pt") as handle:
        metadata = handle.metadata() if keep_header else None
    tensors = {k: v for k, v in load_file(str(src)).items() if not k.startswith(drop)}
    save_file(tensors, str(dst), metadata=metadata)
    return dst


@pytest.fixture(scope="module")
def flux_files(tmp_path_factory) -> dict[str, Path]:
    from tests.kits.flux.tiny_files import write_tiny_flux_files

    return write_tiny_flux_files(tmp_path_factory.mktemp("flux"), "dev", 0)


def flux_keys(files: dict[str, Path], **changes) -> dict:
    keys = {k: files[k] for k in ("clip_l", "t5xxl", "ae")}
    keys.update(tokenizer_path=files["tokenizer"], t5_tokenizer_path=files["t5_tokenizer"])
    return {**keys, **changes}


def test_flux_file_lacking_a_block_its_header_promises(flux_files, tmp_path, caplog):
    """It used to train as a FLUX.1 with one single block less, with a warning."""
    from library.models.families.flux import shapes
    from tests.kits.flux.tiny_shapes import tiny_transformer_config

    assert tiny_transformer_config()["num_single_layers"] == 2  # the header says so
    cut = without(flux_files["transformer"], tmp_path / "cut.safetensors", "single_blocks.1.")
    message = error(cut, **flux_keys(flux_files))
    assert message.startswith(f"pretrained_model_name_or_path = {cut}: its header")
    assert "difftune.config.transformer" in message and "the file is truncated" in message
    assert "single_transformer_blocks.1." in message
    # Without a header that promises more, the shapes decide (pruned models load), as before.
    pruned = without(
        flux_files["transformer"], tmp_path / "pruned.safetensors", "single_blocks.1.", False
    )
    with caplog.at_level(logging.WARNING):
        parts = load(pruned, **flux_keys(flux_files))
    assert parts.denoiser.config.num_single_layers == 1
    # and the plan's model line says what was loaded, against the released counts
    double = tiny_transformer_config()["num_layers"]
    released = shapes.transformer_config()
    assert f", {double} double + 1 single blocks (FLUX.1 releases have " in parts.family.describe()
    assert f"have {released['num_layers']} + {released['num_single_layers']}:" in (
        parts.family.describe()
    )


def test_sd_file_lacking_a_text_encoder_layer_its_header_promises(tmp_path):
    """It used to load as a one-layer text encoder (the shapes' config fits what is left)."""
    from library.models.families.sd.family import SD1
    from library.saving.checkpoint_export import write_single_file
    from tests.kits.sd.tiny import build_tiny_components, tiny_text_config

    assert tiny_text_config()["num_hidden_layers"] == 2
    parts = build_tiny_components("sd1")
    whole = write_single_file(
        tmp_path / "sd1.safetensors", parts["unet"], parts["vae"], [parts["text_encoder"]], SD1,
        torch.float32,
    )  # fmt: skip
    last_layer = "cond_stage_model.transformer.text_model.encoder.layers.1."
    cut = without(whole, tmp_path / "cut.safetensors", last_layer)
    message = error(cut, tokenizer_path=TOKENIZER)
    assert message.startswith(f"{cut}: its header (difftune.config.text_encoder) describes")
    assert "the file is truncated" in message and "encoder.layers.1." in message


@pytest.fixture(scope="module")
def sd_checkpoint(tmp_path_factory) -> Path:
    """An SD 1.x checkpoint with difftune's config header, which describes its 4-channel VAE."""
    from library.models.families.sd.family import SD1
    from library.saving.checkpoint_export import write_single_file
    from tests.kits.sd.tiny import build_tiny_components

    parts = build_tiny_components("sd1")
    path = tmp_path_factory.mktemp("sd") / "sd1.safetensors"
    write_single_file(
        path, parts["unet"], parts["vae"], [parts["text_encoder"]], SD1, torch.float32
    )
    with safe_open(str(path), "pt") as handle:
        assert '"latent_channels": 4' in handle.metadata()["difftune.config.vae"]
    return path


def test_sd_checkpoint_given_as_flux_ae(flux_files, sd_checkpoint):
    """It used to pass the dry run and stop at step 1 with a traceback."""
    message = error(flux_files["transformer"], **flux_keys(flux_files, ae=sd_checkpoint))
    assert message.startswith(f"ae = {sd_checkpoint} is not the 16-channel autoencoder")
    assert "its latents have 4 channels and it has quant convs, FLUX.1's 16" in message


def test_sd_checkpoint_given_as_sd3_vae(tmp_path_factory, sd_checkpoint):
    from tests.kits.sd3.tiny_files import write_tiny_sd3_files

    files = write_tiny_sd3_files(
        tmp_path_factory.mktemp("sd3"), "sd3.5-medium", 0, text_encoders_inside=True
    )
    message = error(
        files["model"], vae=sd_checkpoint, tokenizer_path=files["tokenizer"],
        t5_tokenizer_path=files["t5_tokenizer"],
    )  # fmt: skip
    assert message.startswith(f"vae = {sd_checkpoint} is not the SD3 VAE")
    assert "its latents have 4 channels" in message


def test_vae_option_of_another_latent_width(flux_files, sd_checkpoint, tiny_model_dir):
    """[model] vae replaces a FLUX.1 or SD model's VAE after loading; an SD VAE for FLUX.1 (or
    FLUX.1's for SD) used to pass the dry run, which did not read it, and fail at step 1."""
    message = error(flux_files["transformer"], **flux_keys(flux_files, vae=sd_checkpoint))
    assert message == (
        f"vae = {sd_checkpoint} makes 4-channel latents and this flux-dev model takes 16; set "
        "vae to a VAE of this model's family (or remove it)"
    )
    message = error(tiny_model_dir, vae=flux_files["ae"])
    assert message.startswith(f"vae = {flux_files['ae']} makes 16-channel latents and this sd1")
    sd_vae = tiny_model_dir / "vae" / "diffusion_pytorch_model.safetensors"
    assert load(tiny_model_dir, vae=sd_vae).vae.config.latent_channels == 4


def with_shape(src: Path, dst: Path, key: str, shape: list[int]) -> Path:
    """``src`` with the header entry of ``key`` saying ``shape`` (as many elements: the file
    still opens), its data untouched."""
    data = src.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header[key]["shape"] = shape
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size :])
    return dst


@pytest.mark.parametrize(
    "key",
    [
        "double_blocks.0.img_attn.qkv.weight",  # split into to_q, to_k, to_v
        "single_blocks.1.linear1.weight",  # split by the width, which the wrong shape breaks
        "final_layer.adaLN_modulation.1.weight",  # its halves swapped
        "vector_in.in_layer.weight",  # renamed
    ],
)
def test_a_header_lying_about_one_shape_names_that_tensor(flux_files, tmp_path, key):
    with safe_open(str(flux_files["transformer"]), "pt") as handle:
        shape, keys = handle.get_slice(key).get_shape(), list(handle.keys())
    lying = with_shape(flux_files["transformer"], tmp_path / "lie.safetensors", key, shape[::-1])
    message = error(lying, **flux_keys(flux_files))
    assert "\n" not in message and message.startswith(f"pretrained_model_name_or_path = {lying}")
    named = [k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", message)]
    assert named == [key], message
