"""FLUX.2 [dev] from single files: Black Forest Labs' flux2-dev.safetensors (told from klein by
its guidance input, before any weight is read) with Comfy-Org's Mistral 3 file, whose captions'
states are the folder's; the wrong files refused in one line before any weight is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.flux2.family import claims_flux2
from library.models.loader import load_components
from library.models.model_files import shapes_only
from tests.kits.flux2.tiny import write_tiny_flux2_folder
from tests.kits.flux2.tiny_files import write_tiny_flux2_files
from tests.kits.scaled_fp8 import description, scaled

CAPTIONS = ["a red cube on a table", "two birds"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_tiny_flux2_files(tmp_path_factory.mktemp("dev"), "dev")


def _model(files, **changes) -> ModelSection:
    keys = {"pretrained_model_name_or_path": str(files["transformer"]),
            "tokenizer_path": str(files["tokenizer"]), "vae": str(files["vae"]), **changes}  # fmt: skip
    return ModelSection(**{k: v for k, v in keys.items() if v is not None})


def _refusal(model: ModelSection, text_encoder) -> str:
    """load_components' one-line error, no weight read (the dry run's way)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a weight was read before the refusal")

    with pytest.MonkeyPatch.context() as patch, shapes_only(), pytest.raises(ModelError) as info:
        patch.setattr(CheckpointFile, "tensor", refuse)
        load_components(model, torch.float32, FlowSection(text_encoder=str(text_encoder)))
    message = str(info.value)
    assert "\n" not in message
    return message


def _encoded(parts) -> torch.Tensor:
    with torch.no_grad():
        return parts.family.encode_text(
            parts.tokenizers, parts.text_encoders, CAPTIONS, torch.device("cpu")
        ).hidden


def _cut_after(path: Path, layer: int, out: Path) -> Path:
    """The Mistral 3 file without the decoder layers after ``layer`` (ComfyUI's 30-layer
    files), its header's config saying so."""
    import json

    from safetensors import safe_open

    from library.models.plans import CONFIG_METADATA

    with safe_open(str(path), "pt") as handle:
        header = dict(handle.metadata())
    key = CONFIG_METADATA + "text_encoder"
    header[key] = json.dumps({**json.loads(header[key]), "num_hidden_layers": layer})
    state = load_file(str(path))
    kept = {k: v for k, v in state.items()
            if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= layer)}  # fmt: skip
    save_file(kept, str(out), metadata=header)
    return out


def test_the_mistral_file_gives_the_folders_caption_states(files, tmp_path):
    """Layers 10, 20 and 30 joined per token, as the folder's Mistral3ForConditionalGeneration
    gives them, from the whole file and from one cut after layer 30."""
    folder = write_tiny_flux2_folder(tmp_path / "folder", "dev")
    want = _encoded(load_components(ModelSection(pretrained_model_name_or_path=str(folder)),
                                    torch.float32, FlowSection()))  # fmt: skip
    cut = _cut_after(files["text_encoder"], 30, tmp_path / "mistral_cut.safetensors")
    for text_encoder in (files["text_encoder"], cut):
        parts = load_components(_model(files), torch.float32,
                                FlowSection(text_encoder=str(text_encoder)))  # fmt: skip
        assert (
            parts.family.model == "dev" and type(parts.text_encoders[0]).__name__ == "MistralModel"
        )
        torch.testing.assert_close(_encoded(parts), want, rtol=0, atol=0)


def test_a_comfy_prefixed_dev_file_is_dev_before_any_weight_is_read(files, tmp_path):
    state = load_file(str(files["transformer"]))
    comfy = tmp_path / "flux2_dev_bf16.safetensors"
    save_file({f"model.diffusion_model.{k}": v for k, v in state.items()}, str(comfy))

    def refuse(*args, **kwargs):
        raise AssertionError("a weight was read")

    with pytest.MonkeyPatch.context() as patch, shapes_only():
        patch.setattr(CheckpointFile, "tensor", refuse)
        parts = load_components(_model(files, pretrained_model_name_or_path=str(comfy)),
                                torch.float32, FlowSection(text_encoder=str(files["text_encoder"])))  # fmt: skip
    assert parts.family.model == "dev" and parts.denoiser.config.guidance_embeds


def test_comfys_fp8mixed_file_is_its_dequantized_weights(files, tmp_path):
    """flux2_dev_fp8mixed.safetensors' layout (under model.diffusion_model., a weight_scale,
    input_scale and comfy_quant description beside each fp8 matrix) loads the transformer of a
    file holding each matrix's fp8 values times its scale, computed here."""
    state = {
        f"model.diffusion_model.{k}": v for k, v in load_file(str(files["transformer"])).items()
    }
    stored, want = scaled(state, "comfy_quant")
    denoisers = []
    for name, tensors in (("flux2_dev_fp8mixed", stored), ("dequantized", want)):
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        parts = load_components(_model(files, pretrained_model_name_or_path=str(path)),
                                torch.float32, FlowSection(text_encoder=str(files["text_encoder"])))  # fmt: skip
        denoisers.append(parts.denoiser.state_dict())
    got, by_hand = denoisers
    assert got.keys() == by_hand.keys()
    assert all(torch.equal(got[k], by_hand[k]) for k in got)


def test_an_nvfp4_file_is_refused_as_the_dry_run_plans_it(files, tmp_path):
    """A layer ComfyUI stores as nvfp4 (4-bit blocks): refused before any weight is read,
    naming the key, the format and flux2-dev.safetensors or a folder as the fix."""
    state = load_file(str(files["transformer"]))
    stored, _ = scaled({f"model.diffusion_model.{k}": v for k, v in state.items()}, "comfy_quant")
    key = next(k for k in stored if k.endswith(".comfy_quant"))
    stored[key] = description("nvfp4")
    path = tmp_path / "flux2_dev_nvfp4.safetensors"
    save_file(stored, str(path))
    message = _refusal(
        _model(files, pretrained_model_name_or_path=str(path)), files["text_encoder"]
    )
    assert message.startswith(f"pretrained_model_name_or_path = {path}: {key} stores")
    assert "'nvfp4'" in message and "(flux2-dev.safetensors) or a diffusers folder" in message


def test_a_text_encoder_of_another_width_is_refused_naming_both_files(files, tmp_path):
    """A Mistral 3 twice as wide (its header says so): 48-wide states for a transformer
    taking 24."""
    import json

    from library.models.plans import CONFIG_METADATA

    state = load_file(str(files["text_encoder"]))
    wider = {k: torch.zeros([s * 2 if s == 8 else s for s in v.shape], dtype=v.dtype)
             for k, v in state.items()}  # fmt: skip
    config = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=1, head_dim=4,
                  intermediate_size=16, num_hidden_layers=31, vocab_size=state[
                      "model.embed_tokens.weight"].shape[0])  # fmt: skip
    other = tmp_path / "mistral_other.safetensors"
    save_file(wider, str(other), metadata={CONFIG_METADATA + "text_encoder": json.dumps(config)})
    message = _refusal(_model(files), other)
    assert message.startswith(f"text_encoder = {other} gives 48-wide states and the transformer")
    assert f"of {files['transformer']} reads 24-wide ones" in message
    assert "dev: mistral_3_small_flux2_bf16" in message


def test_klein_and_flux1_files_are_refused_as_the_text_encoder(files, tmp_path):
    from library.models.families.flux.original_keys import TABLE as FLUX1
    from tests.kits.flux.tiny import build_tiny_flux_components

    klein = write_tiny_flux2_files(tmp_path / "klein")["text_encoder"]
    message = _refusal(_model(files), klein)
    assert message.startswith(f"text_encoder = {klein} is not the Mistral 3 text encoder")
    assert (
        "a Qwen3 text model" in message
        and "set text_encoder in [flow] to mistral_3_small" in message
    )
    flux1 = tmp_path / "flux1-dev.safetensors"
    transformer = build_tiny_flux_components("dev")["transformer"]
    save_file({k: v.contiguous() for k, v in FLUX1.to_original(transformer.state_dict()).items()},
              str(flux1))  # fmt: skip
    assert "looks like a FLUX.1 transformer" in _refusal(_model(files), flux1)
    # FLUX.1 [dev] has a guidance input too; only FLUX.2's shared modulation claims a file
    assert not claims_flux2(ModelSection(pretrained_model_name_or_path=str(flux1)), FlowSection())


def test_without_a_tokenizer_the_files_are_refused_by_name(files):
    message = _refusal(_model(files, tokenizer_path=None), files["text_encoder"])
    assert message.startswith("flux2-dev.safetensors carries no tokenizer: set tokenizer_path")
    assert "a FLUX.2 [dev] diffusers folder's tokenizer/" in message
