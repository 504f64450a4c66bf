"""The same 4 samples trained as batch 1 x accumulation 4 and as batch 4 x accumulation 1.

Both must give the same weights after one optimizer step, and the optimizer must have stepped
exactly once: the per-sample noise is keyed by (seed, epoch, position) and the loss is averaged
over the whole effective batch either way.
"""

import pytest
import torch

from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4)


def _run(tmp_path, model_dir, images, name, batch, accumulation, **keys):
    out = tmp_path / name
    config = write_config(
        tmp_path / f"{name}.toml",
        model_dir,
        images,
        out,
        train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_train_steps=1,
        save_state_on_train_end=True,
        # Adam's first step is lr * g / (|g| + eps): with the default eps it is nearly sign(g), so
        # rounding-level differences in tiny gradients would flip whole steps. A larger eps makes
        # the update proportional to the gradient, so the comparison checks gradients themselves.
        optimizer_args=["eps=1e-3"],
        **keys,
    )
    assert train(config) == 0
    return out


def _optimizer_steps(out):
    state = torch.load(out / "run-state" / "optimizer.pt", weights_only=True)["state"]
    return {int(v["step"]) for v in state.values()}


@pytest.mark.parametrize(
    "mode",
    [
        {"network_train_unet_only": True},
        {},  # UNet + text-encoder LoRA
        {"network_train_unet_only": True, "conv_dim": 2, "conv_alpha": 1.0, "min_snr_gamma": 5.0, "noise_offset": 0.1},
        {"train_mode": "unet", "learning_rate": 1e-4},
    ],
    ids=["unet-lora", "unet+te-lora", "locon-snr-offset", "full-unet"],
)
def test_batch4_equals_accumulate4(tmp_path, tiny_model_dir, images, mode):
    acc = _run(tmp_path, tiny_model_dir, images, "acc", 1, 4, **mode)
    big = _run(tmp_path, tiny_model_dir, images, "big", 4, 1, **mode)
    a, b = tensors(acc / "run.safetensors"), tensors(big / "run.safetensors")
    assert_close_dicts(a, b, atol=2e-6, rtol=1e-5)
    assert _optimizer_steps(acc) == {1} and _optimizer_steps(big) == {1}
    # the step changed something: compare with the untouched starting point
    base = tensors(tiny_model_dir / "unet" / "diffusion_pytorch_model.safetensors")
    if mode.get("train_mode") == "unet":
        trained = tensors(acc / "run" / "unet" / "diffusion_pytorch_model.safetensors")
        assert any(not torch.equal(trained[k], base[k]) for k in base)
    else:
        assert any(k.endswith("lora_up.weight") and a[k].abs().sum() > 0 for k in a)


def test_two_steps_differ_from_one_big_step(tmp_path, tiny_model_dir, images):
    """Guards the test above: with 2 optimizer steps of 2 samples the result must differ."""
    one = _run(tmp_path, tiny_model_dir, images, "one", 4, 1, network_train_unet_only=True)
    two_cfg = write_config(
        tmp_path / "two.toml", tiny_model_dir, images, tmp_path / "two",
        train_batch_size=1, gradient_accumulation_steps=2, max_train_steps=2,
        network_train_unet_only=True,
    )
    assert train(two_cfg) == 0
    a, b = tensors(one / "run.safetensors"), tensors(tmp_path / "two" / "run.safetensors")
    assert any(not torch.allclose(a[k], b[k], atol=1e-5) for k in a)
