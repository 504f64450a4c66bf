"""Mistral 3's single text-encoder file (library/models/families/mistral3_file.py): Comfy-Org's
layout read as the language model of the Mistral3ForConditionalGeneration it came from, a file
cut after the deepest layer read giving that layer's states as the whole model does, and the
wrong files refused by name before any weight is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.mistral3_file import mistral_config_from_shapes, plan_mistral3_file
from library.models.plans import CONFIG_METADATA, load_plan
from library.models.released_configs import mistral_small_3_text_config
from tests.kits.flux2.tiny import mistral3_encoder
from tests.kits.flux2.tiny_files import comfy_mistral3
from tests.kits.scaled_fp8 import scaled

READS = 30  # the deepest hidden state read (FLUX.2 [dev]'s layers 10, 20, 30)


def _write(path: Path, state: dict, config: dict | None) -> CheckpointFile:
    header = {"format": "pt"}
    if config is not None:
        header[CONFIG_METADATA + "text_encoder"] = json.dumps(config)
    save_file(state, str(path), metadata=header)
    return CheckpointFile(path)


def _plan(file: CheckpointFile):
    return plan_mistral3_file(file, "text_encoder", "Mistral 3", "mistral_3.safetensors", READS)


def _states(model, ids) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states


def test_the_released_config_comes_back_from_its_shapes():
    from transformers import MistralConfig, MistralModel

    released = mistral_small_3_text_config()
    with torch.device("meta"):
        model = MistralModel(MistralConfig(**released))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert mistral_config_from_shapes(shapes, released) == released


@pytest.mark.parametrize("layers", [31, READS])
def test_comfy_files_read_the_language_model_alone(tmp_path, layers):
    """The whole file, and one cut after layer 30: layer 30's states are the whole model's."""
    torch.manual_seed(0)
    encoder = mistral3_encoder().eval()
    config = {**encoder.config.text_config.to_dict(), "num_hidden_layers": layers}
    state = {k: v for k, v in comfy_mistral3(encoder).items()
             if not k.startswith(f"model.layers.{layers}.")}  # fmt: skip
    plan = _plan(_write(tmp_path / "m.safetensors", state, config))
    assert not any(
        k.startswith(("vision_tower.", "multi_modal_projector.", "tekken")) for k in plan.keys
    )
    model = load_plan(plan, torch.float32)
    language = encoder.model.language_model
    assert (
        model.state_dict().keys()
        == {
            k: v for k, v in language.state_dict().items() if not k.startswith(f"layers.{layers}.")
        }.keys()
    )
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    got, want = _states(model, ids), _states(language, ids)
    for layer in (10, 20, READS):
        torch.testing.assert_close(got[layer], want[layer], rtol=0, atol=0)


def test_a_scaled_fp8_file_is_its_dequantized_weights(tmp_path):
    """ComfyUI's scaled layout (a weight_scale and comfy_quant description beside each fp8
    matrix) reads the language model of a file holding each matrix's fp8 values times its
    scale, computed here."""
    torch.manual_seed(0)
    encoder = mistral3_encoder().eval()
    config = encoder.config.text_config.to_dict()
    stored, want = scaled(comfy_mistral3(encoder), "comfy_quant")
    got, by_hand = (
        load_plan(_plan(_write(tmp_path / f"{name}.safetensors", state, config)), torch.float32)
        for name, state in (("fp8_scaled", stored), ("dequantized", want))
    )
    got, by_hand = got.state_dict(), by_hand.state_dict()
    assert got.keys() == by_hand.keys() and all(torch.equal(got[k], by_hand[k]) for k in got)


@pytest.fixture
def no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a weight was read")

    monkeypatch.setattr(CheckpointFile, "tensor", refuse)


def test_wrong_files_are_refused_by_name_before_any_weight_is_read(tmp_path, no_weights_read):
    encoder = mistral3_encoder()
    state = comfy_mistral3(encoder)
    short = {
        k: v for k, v in state.items() if not k.startswith(("model.layers.29.", "model.layers.30."))
    }
    with pytest.raises(
        ModelError, match=r"^text_encoder = .*short.* holds 29 decoder layers .*layer 30"
    ):
        _plan(_write(tmp_path / "short.safetensors", short, None))
    qwen = {**state, "model.layers.0.self_attn.q_norm.weight": torch.ones(4)}
    with pytest.raises(
        ModelError, match=r"^text_encoder = .*qwen.* is not Mistral 3: .*a Qwen3 text model"
    ):
        _plan(_write(tmp_path / "qwen.safetensors", qwen, None))


def test_a_headerless_file_whose_heads_do_not_fit_is_refused(tmp_path, no_weights_read):
    """Without a header the head width is the released 128, which the tiny queries (8 rows) are
    no whole number of: refused as a misfit in one line, not a crash building the model."""
    state = comfy_mistral3(mistral3_encoder())
    with pytest.raises(ModelError, match=r"^text_encoder = .*tiny.*sizes fit no Mistral 3 text"):
        _plan(_write(tmp_path / "tiny.safetensors", state, None))


def test_a_plain_float8_file_is_read_cast_to_the_weight_dtype(tmp_path):
    """mistral_3_small_flux2_fp8.safetensors without scales: its float8 weights, cast."""
    encoder = mistral3_encoder()
    fp8 = {k: v.to(torch.float8_e4m3fn) if v.is_floating_point() else v
           for k, v in comfy_mistral3(encoder).items()}  # fmt: skip
    config = encoder.config.text_config.to_dict()
    model = load_plan(_plan(_write(tmp_path / "fp8.safetensors", fp8, config)), torch.float32)
    for key, value in model.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, fp8[f"model.{key}"].to(torch.float32)), key
