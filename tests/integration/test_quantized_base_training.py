"""LoRA training over a quantized base (base_model_precision) end to end on the tiny FLUX.1:

- a LoRA trained over the nf4 base is, weight for weight, the LoRA trained over a float model
  holding the nf4 weights dequantized (the layer computes with exactly those), and near the
  LoRA over the float base, as near as each format's rounding allows (the test states the
  bounds and why);
- with int8 and double-quantized nf4 too, the saved file has the float run's keys and dtypes
  (ordinary adapter weights for the full-precision base);
- one batch of 4, 2 x 2 accumulated, and a run stopped and resumed train the same LoRA over nf4;
- block swap over the nf4 base trains the same LoRA as without it;
- what cannot work is refused by the config before anything loads.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from library.models.quantized_base import QuantizedLinear
from tests.integration.harness import (
    check_folder_lora_resumes,
    make_images,
    tensors,
    train,
    write_config,
)
from tests.integration.test_flux_training import FLUX

RUN = {
    **FLUX,
    "max_train_steps": 2,
    "train_batch_size": 2,
    # Adam's first updates follow the gradient rather than its sign, so a small change of the
    # gradient (the quantization error's) makes a small change of the LoRA
    "optimizer_args": ["eps=1e-3"],
}


@pytest.fixture(scope="module")
def flux_dir(kit_folders):
    """The session's tiny kit folder (flux dev, seed 0): read only."""
    return kit_folders("flux", "dev")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4, size=64)


def _run(tmp_path, model, images, name, **keys):
    out = tmp_path / name
    config = write_config(tmp_path / f"{name}.toml", model, images, out, **{**RUN, **keys})
    assert train(config) == 0
    return tensors(out / "run.safetensors")


def _dequantized_folder(flux_dir, where, precision="nf4"):
    """The folder with every Linear weight of its transformer replaced by its quantized form,
    dequantized: the float model the quantized layers compute with."""
    from diffusers import FluxTransformer2DModel

    folder = shutil.copytree(flux_dir, where)
    transformer = FluxTransformer2DModel.from_pretrained(folder / "transformer")
    with torch.no_grad():
        for module in transformer.modules():
            if type(module) is nn.Linear:
                stored = QuantizedLinear(module.requires_grad_(False), precision, False,
                                         torch.float32)  # fmt: skip
                module.weight.copy_(stored.dequantized(torch.float32))
    transformer.save_pretrained(folder / "transformer")
    return folder


def test_a_quantized_base_trains_the_lora_of_its_dequantized_weights(tmp_path, flux_dir, images):
    quantized = _run(tmp_path, flux_dir, images, "nf4", base_model_precision="nf4-bnb")
    dequantized = _run(tmp_path, _dequantized_folder(flux_dir, tmp_path / "deq-model"), images,
                       "deq")  # fmt: skip
    for key, value in dequantized.items():
        torch.testing.assert_close(quantized[key], value, rtol=0, atol=1e-7, msg=key)
    # Against the float base. int8 rounds each weight by at most half of its row's step (0.4%
    # of the weights on average here): the LoRA is within 5%. nf4 rounds by about 9% on average
    # (4 bits), which two steps of a tiny model amplify: every module's change still points the
    # same way (cosine >= 0.8) and differs by under 40% on average.
    plain = _run(tmp_path, flux_dir, images, "plain")
    int8 = _run(tmp_path, flux_dir, images, "int8", base_model_precision="int8-bnb")
    assert quantized.keys() == plain.keys() == int8.keys()
    ups = [k for k in plain if k.endswith("lora_up.weight")]

    def apart(run, key):
        return float((run[key].float() - plain[key].float()).norm() / plain[key].float().norm())

    assert max(apart(int8, k) for k in ups) <= 0.05
    assert sum(apart(quantized, k) for k in ups) / len(ups) <= 0.4
    for key in ups:
        cosine = nn.functional.cosine_similarity(quantized[key].float().flatten(),
                                                 plain[key].float().flatten(), dim=0)  # fmt: skip
        assert cosine >= 0.8, key


@pytest.mark.parametrize("keys", [{"base_model_precision": "int8-bnb"},
                                  {"base_model_precision": "nf4-bnb",
                                   "bnb_4bit_use_double_quant": True}],
                         ids=["int8", "nf4-dq"])  # fmt: skip
def test_files_from_a_quantized_run_are_ordinary_lora_files(tmp_path, flux_dir, images, keys):
    plain = _run(tmp_path, flux_dir, images, "plain", max_train_steps=1)
    ours = _run(tmp_path, flux_dir, images, "ours", max_train_steps=1, **keys)
    assert ours.keys() == plain.keys()
    assert all(ours[k].dtype == plain[k].dtype and ours[k].shape == plain[k].shape for k in plain)
    assert any(not torch.equal(ours[k], plain[k]) for k in plain)  # trained over another base


def test_accumulation_and_resume_over_an_nf4_base(tmp_path, flux_dir, images, monkeypatch):
    run = {**RUN, "base_model_precision": "nf4-bnb", "optimizer_args": ["eps=1e-3"]}
    check_folder_lora_resumes(tmp_path, flux_dir, images, run, monkeypatch)


def test_block_swap_over_an_nf4_base_trains_the_same_lora(tmp_path, flux_dir, images):
    keys = {"base_model_precision": "nf4-bnb", "bnb_4bit_use_double_quant": True}
    swapped = _run(tmp_path, flux_dir, images, "swapped", blocks_to_swap=2, **keys)
    whole = _run(tmp_path, flux_dir, images, "whole", **keys)
    assert swapped.keys() == whole.keys()
    for key, value in whole.items():
        torch.testing.assert_close(swapped[key], value, rtol=0, atol=1e-7, msg=key)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"train_mode": "unet"}, 'with train_mode = "unet" every denoiser weight trains'),
        ({"fsdp": "full_shard"}, "quantized weights cannot be sharded"),
        ({"fp8_base_unet": True}, "both store the denoiser's frozen weights"),
        ({"base_model_precision": "int8-bnb", "bnb_4bit_use_double_quant": True},
         'only acts with base_model_precision = "nf4-bnb"'),
        ({"base_model_precision": "nf8-bnb"}, "base_model_precision"),
    ],
)  # fmt: skip
def test_what_cannot_work_is_refused_before_training(tmp_path, flux_dir, images, capfd, keys,
                                                     message):  # fmt: skip
    keys = {"base_model_precision": "nf4-bnb", **keys}
    config = write_config(tmp_path / "c.toml", flux_dir, images, tmp_path / "out",
                          **{**RUN, **keys})  # fmt: skip
    assert train(config) != 0
    err = capfd.readouterr().err
    assert message in err, err[-2000:]
    assert not (tmp_path / "out" / "run.safetensors").exists()


def test_the_plan_says_how_the_frozen_weights_are_stored(tmp_path, flux_dir, images, capfd):
    keys = {"base_model_precision": "nf4-bnb", "bnb_4bit_use_double_quant": True,
            "fp8_base": True, "blocks_to_swap": 2, "mixed_precision": "bf16"}  # fmt: skip
    config = write_config(tmp_path / "c.toml", flux_dir, images, tmp_path / "out",
                          **{**RUN, **keys})  # fmt: skip
    assert train(config, "--dry_run") == 0
    out = capfd.readouterr()
    assert ("frozen weights: denoiser nf4 (bitsandbytes, double quant), text encoders float8; "
            "the last 2 blocks' in host memory (blocks_to_swap)") in out.out + out.err  # fmt: skip
