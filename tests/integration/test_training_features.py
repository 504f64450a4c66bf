"""Training options end to end on the tiny models: logging, cadence, precision, NaN, starting points."""

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from library.training import step as step_module
from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4)


def _config(tmp_path, model, images, name="c", **keys):
    return write_config(tmp_path / f"{name}.toml", model, images, tmp_path / name, **keys)


def _scalars(logdir):
    runs = [p for p in logdir.rglob("events.out.tfevents.*")]
    assert runs, f"no event file under {logdir}"
    acc = EventAccumulator(str(runs[0].parent))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_logs_once_per_optimizer_step(tmp_path, tiny_model_dir, images):
    logdir = tmp_path / "logs"
    config = _config(
        tmp_path, tiny_model_dir, images, train_batch_size=1, gradient_accumulation_steps=2,
        max_train_steps=4, log_with="tensorboard", logging_dir=str(logdir),
        lr_scheduler="linear", lr_warmup_steps=2, unet_lr=2e-3, text_encoder_lr=5e-4,
        max_grad_norm=1.0,
    )
    assert train(config) == 0
    scalars = _scalars(logdir)
    for tag in ("loss/step", "lr/unet", "lr/text_encoder", "grad_norm", "samples_per_second", "loss/epoch"):
        assert tag in scalars, sorted(scalars)
    assert [s for s, _ in scalars["loss/step"]] == [1, 2, 3, 4]  # optimizer steps, not micro-batches
    # linear warmup over 2 steps then linear decay to 0 at step 4, per group base lr
    unet = [v for _, v in scalars["lr/unet"]]
    te = [v for _, v in scalars["lr/text_encoder"]]
    assert unet == pytest.approx([1e-3, 2e-3, 1e-3, 0.0])
    assert te == pytest.approx([2.5e-4, 5e-4, 2.5e-4, 0.0])
    # 4 images, effective batch 2 -> 2 steps per epoch -> epoch losses at steps 2 and 4
    assert [s for s, _ in scalars["loss/epoch"]] == [2, 4]
    step_losses = dict(scalars["loss/step"])
    assert scalars["loss/epoch"][0][1] == pytest.approx((step_losses[1] + step_losses[2]) / 2)


def test_logged_loss_is_the_mean_over_micro_batches(tmp_path, tiny_model_dir, images):
    def logged(name, batch, accumulation):
        logdir = tmp_path / f"logs-{name}"
        config = _config(
            tmp_path, tiny_model_dir, images, name, train_batch_size=batch,
            gradient_accumulation_steps=accumulation, max_train_steps=1,
            log_with="tensorboard", logging_dir=str(logdir),
        )
        assert train(config) == 0
        return _scalars(logdir)["loss/step"][0][1]

    assert logged("acc", 1, 4) == pytest.approx(logged("big", 4, 1), rel=1e-5)


def test_save_cadence_precision_and_pruning(tmp_path, tiny_model_dir, images):
    config = _config(
        tmp_path, tiny_model_dir, images, train_batch_size=2, max_train_steps=6,
        save_every_n_steps=2, save_last_n_steps=1, save_every_n_epochs=1, save_state=True,
        save_precision="fp16",
    )
    assert train(config) == 0
    out = tmp_path / "c"
    names = sorted(p.name for p in out.iterdir() if p.name != "run-summary.json")  # a record
    # steps per epoch = 2: epoch saves at steps 2 and 4 (epoch 3 ends the run: the final save);
    # step saves at 2 and 4, and step 4's save prunes step 2 (older than 1 step before it);
    # save_state also saves the state at the end
    assert names == [
        "run-000001-state", "run-000001.safetensors", "run-000002-state", "run-000002.safetensors",
        "run-state",
        "run-step00000004-state", "run-step00000004.safetensors", "run.safetensors",
    ]
    final = tensors(out / "run.safetensors")
    assert {t.dtype for k, t in final.items() if not k.endswith(".alpha")} == {torch.float16}
    progress = json.loads((out / "run-step00000004-state" / "progress.json").read_text())
    assert progress["global_step"] == 4
    # the epoch-2 save and the step-4 save are the same point of the run
    assert_close_dicts(tensors(out / "run-000002.safetensors"), tensors(out / "run-step00000004.safetensors"), atol=0)


def test_non_finite_loss_stops_before_touching_weights(tmp_path, tiny_model_dir, images, monkeypatch, capsys):
    real = step_module.micro_batch_loss
    calls = {"n": 0}

    def poisoned(inputs, batch):
        calls["n"] += 1
        loss = real(inputs, batch)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr("library.training.trainer.micro_batch_loss", poisoned)
    config = _config(tmp_path, tiny_model_dir, images, max_train_steps=4)
    assert train(config) == 1
    err = capsys.readouterr().err
    assert "optimizer step 3" in err and "nan" in err
    state = tmp_path / "c" / "run-step00000002-state"
    assert json.loads((state / "progress.json").read_text())["global_step"] == 2
    saved = tensors(state / "trained.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
    assert not (tmp_path / "c" / "run.safetensors").exists()


def test_gradient_checkpointing_changes_nothing(tmp_path, tiny_model_dir, images):
    keys = dict(train_batch_size=2, max_train_steps=2, optimizer_args=["eps=1e-3"])
    assert train(_config(tmp_path, tiny_model_dir, images, "plain", **keys)) == 0
    assert train(_config(tmp_path, tiny_model_dir, images, "ckpt", gradient_checkpointing=True, **keys)) == 0
    assert_close_dicts(
        tensors(tmp_path / "plain" / "run.safetensors"), tensors(tmp_path / "ckpt" / "run.safetensors"), atol=1e-6
    )


def test_network_weights_continue_from_a_file(tmp_path, tiny_model_dir, images):
    """2 steps, then 2 more from the saved file, differ from 2 steps from scratch but start where it ended."""
    keys = dict(train_batch_size=2, max_train_steps=2)
    assert train(_config(tmp_path, tiny_model_dir, images, "first", **keys)) == 0
    first = tmp_path / "first" / "run.safetensors"
    assert train(_config(tmp_path, tiny_model_dir, images, "zero", network_weights=str(first), learning_rate=0.0, **keys)) == 0
    # with learning rate 0 the output is exactly the file we started from
    assert_close_dicts(tensors(tmp_path / "zero" / "run.safetensors"), tensors(first), atol=0)
    assert train(_config(tmp_path, tiny_model_dir, images, "more", network_weights=str(first), **keys)) == 0
    more = tensors(tmp_path / "more" / "run.safetensors")
    assert any(not torch.equal(more[k], t) for k, t in tensors(first).items())


def test_bf16_and_v_prediction_train(tmp_path, tiny_sd2v_model_dir, images):
    config = _config(
        tmp_path, tiny_sd2v_model_dir, images, train_batch_size=2, max_train_steps=2,
        mixed_precision="bf16", min_snr_gamma=5.0,
    )
    assert train(config) == 0
    from library.saving.lora_file import read_lora_file

    weights, metadata = read_lora_file(tmp_path / "c" / "run.safetensors")
    assert metadata["ss_base_model_version"] == "sd_v2_v"
    assert metadata["modelspec.architecture"] == "stable-diffusion-v2-768-v/lora"
    assert metadata["modelspec.prediction_type"] == "v"
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in weights.values())


def test_full_unet_outputs_load_in_diffusers(tmp_path, tiny_model_dir, images):
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from safetensors import safe_open

    from library.config.schema import ModelSection
    from library.models.loader import load_components

    config = _config(tmp_path, tiny_model_dir, images, train_mode="unet", learning_rate=1e-4, max_train_steps=1)
    assert train(config) == 0
    out = tmp_path / "c"
    # the diffusers folder: the trained UNet, and the base's other parts
    unet = UNet2DConditionModel.from_pretrained(out / "run" / "unet")
    folder_unet = unet.state_dict()
    base = tensors(tiny_model_dir / "unet" / "diffusion_pytorch_model.safetensors")
    assert any(not torch.equal(base[k], folder_unet[k]) for k in base)
    pipe = StableDiffusionPipeline.from_pretrained(out / "run", safety_checker=None)
    image = pipe("a shape", num_inference_steps=2, height=64, width=64, output_type="np").images
    assert image.shape == (1, 64, 64, 3)
    # its text encoder uses the text_model. layout older transformers need
    with safe_open(str(out / "run" / "text_encoder" / "model.safetensors"), "pt") as f:
        names = f.keys()
    assert all(k.startswith("text_model.") for k in names)
    # the single file is an original-layout checkpoint holding the same UNet
    with safe_open(str(out / "run.safetensors"), "pt") as f:
        names = f.keys()
    assert any(k.startswith("model.diffusion_model.") for k in names)
    loaded = load_components(
        ModelSection(pretrained_model_name_or_path=str(out / "run.safetensors"), tokenizer_path=str(tiny_model_dir / "tokenizer")),
        torch.float32,
    )
    assert_close_dicts(loaded.denoiser.state_dict(), folder_unet, atol=0)


def test_wandb_offline_run_records_the_steps(tmp_path, tiny_model_dir, images, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logdir = tmp_path / "logs"
    config = _config(
        tmp_path, tiny_model_dir, images, max_train_steps=2, log_with="all",
        logging_dir=str(logdir), log_prefix="try-", wandb_run_name="my-run",
    )
    assert train(config) == 0
    runs = list(logdir.glob("try-*"))
    assert len(runs) == 1  # one folder per run: <log_prefix><date-time>
    assert list(runs[0].rglob("events.out.tfevents.*")), "tensorboard wrote nothing"
    history = list(runs[0].rglob("run-*.wandb"))
    assert history, "wandb wrote no offline run"
    assert b"loss/step" in history[0].read_bytes()


def test_full_bf16_trains_bf16_weights_close_to_float32_ones(tmp_path, tiny_model_dir, images):
    from safetensors.torch import load_file

    keys = dict(train_batch_size=2, max_train_steps=2, mixed_precision="bf16", save_state_on_train_end=True)
    assert train(_config(tmp_path, tiny_model_dir, images, "half", full_bf16=True, **keys)) == 0
    assert train(_config(tmp_path, tiny_model_dir, images, "mixed", **keys)) == 0
    state = load_file(str(tmp_path / "half" / "run-state" / "trained.safetensors"))
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    assert all(torch.isfinite(t).all() for t in state.values())
    half, mixed = tensors(tmp_path / "half" / "run.safetensors"), tensors(tmp_path / "mixed" / "run.safetensors")
    # the same steps, rounded to bfloat16 on the way: close, but not the float32 weights
    assert_close_dicts(half, mixed, atol=2e-2)
    assert any(not torch.equal(half[k], mixed[k]) for k in half)


def test_scale_weight_norms_keeps_every_update_within_the_limit(tmp_path, tiny_model_dir, images):
    from tests.networks.lora_merge import lora_delta

    def update_norms(path):
        weights = tensors(path)
        norms = []
        for key in weights:
            if key.endswith(".lora_down.weight"):
                name = key.removesuffix(".lora_down.weight")
                down, up = weights[key], weights[f"{name}.lora_up.weight"]
                scale = weights[f"{name}.alpha"].item() / down.shape[0]
                shape = (up.shape[0], *down.shape[1:])
                norms.append(lora_delta(down, up, scale, torch.Size(shape)).norm().item())
        return norms

    keys = dict(max_train_steps=3, learning_rate=1e-2, network_alpha=4.0)
    assert train(_config(tmp_path, tiny_model_dir, images, "free", **keys)) == 0
    free = update_norms(tmp_path / "free" / "run.safetensors")
    limit = sorted(free)[len(free) // 2]
    assert train(_config(tmp_path, tiny_model_dir, images, "held", scale_weight_norms=limit, **keys)) == 0
    held = update_norms(tmp_path / "held" / "run.safetensors")
    assert max(free) > limit * 1.5  # without the limit, updates grow past it
    assert max(held) <= limit * (1 + 1e-4)
