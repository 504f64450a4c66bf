"""diffusers' ``lora_adapter_metadata`` header as network_weights reads it: a header that is not
what diffusers writes is one CheckpointError naming the file, the field and the fix (never a
traceback, never a NaN scale); alpha 0, in the header or in kohya/musubi-tuner alpha tensors, is
read as kohya reads it (alpha = rank), said once and saved so.

The files are what the tools write: diffusers' own save_lora_weights of a peft adapter
(Qwen-Image, tests/models/qwenimage/test_qwenimage_lora_layouts.py), and musubi-tuner's
``lora_unet_<path>`` names with ``.alpha`` tensors.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file

from library.errors import CheckpointError
from library.models.families.qwenimage.family import qwenimage_family
from library.networks.fused_keys import adapter_weights
from library.networks.kohya_names import UNET
from library.networks.lora import randomize_lora
from tests.models.qwenimage.test_qwenimage_lora_layouts import _adapted, _import, _peft_file

HEADER = "lora_adapter_metadata"


def _with_header(path, out, edit) -> str:
    """``path`` saved again as ``out`` with its header entry replaced by ``edit(config)``
    (config: the parsed JSON diffusers wrote); returns the file name."""
    with safe_open(str(path), "pt") as handle:
        metadata = dict(handle.metadata())
    metadata[HEADER] = edit(json.loads(metadata[HEADER]))
    save_file(load_file(str(path)), str(out), metadata=metadata)
    return str(out)


def _set(field, value):
    return lambda config: json.dumps({**config, f"transformer.{field}": value})


BROKEN = {
    "not JSON": (lambda config: "{transformer.r: 4", "is not JSON"),
    "a list": (lambda config: json.dumps([config]), "is a JSON list"),
    "a string alpha": (_set("lora_alpha", "four"), 'transformer.lora_alpha is "four"'),
    "a list alpha": (_set("lora_alpha", [4]), "transformer.lora_alpha is [4]"),
    "a bad pattern": (_set("alpha_pattern", {"blocks.(": 2.0}), "alpha_pattern['blocks.(']"),
    "a NaN alpha": (_set("lora_alpha", float("nan")), "transformer.lora_alpha is nan"),
    "an infinite alpha": (_set("lora_alpha", float("inf")), "transformer.lora_alpha is inf"),
    "a string flag": (_set("use_rslora", "false"), "transformer.use_rslora"),
}


@pytest.fixture(scope="module")
def peft_file(tmp_path_factory):
    return _peft_file(tmp_path_factory.mktemp("peft"), metadata=True)


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_header_is_one_line_naming_the_file_and_the_field(case, peft_file, tmp_path):
    edit, field = BROKEN[case]
    path = _with_header(peft_file[0], tmp_path / "broken.safetensors", edit)
    with pytest.raises(CheckpointError) as caught:
        _import(path, _adapted(rank=4))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: its {HEADER} header")
    assert field in message and "save_lora_weights" in message, message


def test_lora_alpha_0_is_rank_said_once_and_saved(peft_file, tmp_path, caplog):
    """peft's lora_alpha 0 (one module keeps its alpha_pattern value): alpha = rank, so the
    change is up @ down, as a kohya network reads alpha 0."""
    path = _with_header(peft_file[0], tmp_path / "zero.safetensors", _set("lora_alpha", 0))
    model = _adapted(rank=4)
    with caplog.at_level(logging.WARNING):
        _import(path, model)
    (record,) = [r for r in caplog.records if "alpha 0" in r.getMessage()]
    assert path in record.getMessage() and "transformer.lora_alpha" in record.getMessage()
    tensors = load_file(path)
    for module, (down, _up, alpha) in adapter_weights(model).items():
        want = 2.0 if module == "transformer_blocks.1.attn.to_q" else float(down.shape[0])
        assert alpha == want, module
        assert torch.equal(down, tensors[f"transformer.{module}.lora_A.weight"])
    written = qwenimage_family().lora_tensors({UNET: model})
    alphas = {k: float(v) for k, v in written.items() if k.endswith(".alpha")}
    assert alphas and set(alphas.values()) == {4.0, 2.0}


def test_alpha_tensors_of_0_are_rank_said_once_and_saved(tmp_path, caplog):
    """musubi-tuner's names with alpha tensors of 0 (as kohya's networks write when told
    network_alpha = 0): alpha = rank, not a scale of 0 that trains nothing."""
    trained = _adapted(rank=4, alpha=2.0)
    randomize_lora(trained, torch.Generator().manual_seed(5))
    ours = qwenimage_family().lora_tensors({UNET: trained})
    musubi = {}
    for key, value in ours.items():
        module, _, tensor = key.removeprefix("diffusion_model.").partition(".lora_")
        if key.endswith(".alpha"):
            module, tensor = key.removeprefix("diffusion_model.")[: -len(".alpha")], "alpha"
            value = torch.tensor(0.0)
        else:
            tensor = "lora_" + tensor
        musubi[f"lora_unet_{module.replace('.', '_')}.{tensor}"] = value
    path = tmp_path / "musubi.safetensors"
    save_file(musubi, str(path), metadata={"ss_network_module": "networks.lora_qwen_image"})
    model = _adapted(rank=4, alpha=2.0)
    with caplog.at_level(logging.WARNING):
        _import(path, model)
    (record,) = [r for r in caplog.records if "alpha 0" in r.getMessage()]
    count = sum(k.endswith(".alpha") for k in musubi)
    assert str(path) in record.getMessage() and f"{count} alpha tensors" in record.getMessage()
    weights = adapter_weights(model)
    assert len(weights) == count
    for module, (_down, up, alpha) in weights.items():
        assert alpha == 4.0, module
        assert torch.equal(up, adapter_weights(trained)[module][1])
    written = qwenimage_family().lora_tensors({UNET: model})
    assert {float(v) for k, v in written.items() if k.endswith(".alpha")} == {4.0}
