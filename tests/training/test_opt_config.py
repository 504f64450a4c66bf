"""Optimizer names, arguments and their schedule rules are checked when the config loads."""

import pytest

from library.config.loader import load_config
from library.errors import ConfigError

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'


def _load(tmp_path, lines: str):
    path = tmp_path / "c.toml"
    path.write_text(HEAD + lines + "\n" + DATASET, encoding="utf-8")
    return load_config(str(path)), str(path)


def _error(tmp_path, lines: str) -> tuple[str, str]:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, lines)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    return message, str(tmp_path / "c.toml")


@pytest.mark.parametrize(
    "written,canonical",
    [
        ("lion", "Lion"),
        ("PAGEDADAMW8BIT", "PagedAdamW8bit"),
        ("prodigy", "Prodigy"),
        ("sgdnesterov8bit", "SGDNesterov8bit"),
        ("adamwschedulefree", "AdamWScheduleFree"),
        ("torch.optim.RMSprop", "torch.optim.RMSprop"),
    ],
)
def test_names_load_case_insensitively(tmp_path, written, canonical):
    config, _ = _load(tmp_path, f'optimizer_type = "{written}"')
    assert config.optimizer.optimizer_type == canonical


def test_unknown_name_names_the_nearest_and_the_known_ones(tmp_path):
    message, path = _error(tmp_path, 'optimizer_type = "Lionn"')
    assert message.startswith(
        f'config error in {path}: key "optimizer_type" = "Lionn" is not valid'
    )
    assert 'did you mean "Lion"?' in message and "AdamW8bit" in message and "Prodigy" in message


def test_class_path_that_does_not_import_is_an_error(tmp_path):
    message, _ = _error(tmp_path, 'optimizer_type = "torch.optim.NoSuchThing"')
    assert "torch.optim has no optimizer class NoSuchThing" in message
    message, _ = _error(tmp_path, 'optimizer_type = "nosuchpkg_xyz.Opt"')
    assert "cannot import nosuchpkg_xyz" in message


def test_dadaptation_is_refused_with_a_reason(tmp_path):
    message, _ = _error(tmp_path, 'optimizer_type = "DAdaptAdam"')
    assert 'optimizer_type = "DAdaptAdam" is not supported' in message and "Prodigy" in message


@pytest.mark.parametrize(
    "lines,expected",
    [
        ('optimizer_type = "Adafactor"\nlr_scheduler = "cosine"', 'use lr_scheduler = "adafactor"'),
        (
            'optimizer_type = "Adafactor"\nlr_scheduler = "adafactor"\nlr_warmup_steps = 10',
            "lr_warmup_steps = 0",
        ),
        (
            'optimizer_type = "Adafactor"\noptimizer_args = ["relative_step=False", "warmup_init=True"]',
            "warmup_init=True needs relative_step=True",
        ),
        ('lr_scheduler = "adafactor"', 'only goes with optimizer_type = "Adafactor"'),
        ('optimizer_type = "Adafactor"\nloraplus_lr_ratio = 16', "LoRA+ needs learning rates"),
        ('optimizer_type = "prodigy"\nloraplus_lr_ratio = 16', "Prodigy takes one learning rate"),
        (
            'optimizer_type = "AdamWScheduleFree"\nlr_scheduler = "cosine"',
            'AdamWScheduleFree needs no schedule: set lr_scheduler = "constant"',
        ),
    ],
)
def test_schedule_rules(tmp_path, lines, expected):
    message, path = _error(tmp_path, lines)
    assert message.startswith(f"config error in {path}: ") and expected in message


def test_adafactor_forms_that_load(tmp_path):
    config, _ = _load(tmp_path, 'optimizer_type = "adafactor"\nlr_scheduler = "adafactor"')
    assert config.optimizer.optimizer_type == "Adafactor"
    relative_off = (
        'optimizer_type = "Adafactor"\noptimizer_args = ["relative_step=False", '
        '"scale_parameter=False"]\nlr_scheduler = "cosine"\nlr_warmup_steps = 5'
    )
    assert _load(tmp_path, relative_off)[0].optimizer.lr_scheduler == "cosine"


def test_loraplus_from_network_args_and_keys(tmp_path):
    config, _ = _load(tmp_path, 'network_args = ["loraplus_lr_ratio=16"]')
    assert config.optimizer.loraplus_lr_ratio == 16
    config, _ = _load(tmp_path, "loraplus_unet_lr_ratio = 8.0\nloraplus_text_encoder_lr_ratio = 2")
    assert (
        config.optimizer.loraplus_unet_lr_ratio,
        config.optimizer.loraplus_text_encoder_lr_ratio,
    ) == (8, 2)
    message, _ = _error(tmp_path, "loraplus_lr_ratio = 0")
    assert "loraplus_lr_ratio" in message


@pytest.mark.parametrize(
    "lines,expected",
    [
        ("adaptive_noise_scale = 0.1", "adaptive_noise_scale only acts together with noise_offset"),
        ("ip_noise_gamma_random_strength = true", "together with ip_noise_gamma"),
        (
            "min_timestep = 600\nmax_timestep = 500",
            "min_timestep = 600 is above max_timestep = 500",
        ),
        ('loss_type = "l3"', 'key "loss_type" = "l3" is not valid'),
        ('huber_schedule = "linear"', 'key "huber_schedule" = "linear" is not valid'),
    ],
)
def test_noise_and_loss_key_errors(tmp_path, lines, expected):
    message, _ = _error(tmp_path, lines)
    assert expected in message


def test_kohya_noise_and_loss_keys_load(tmp_path):
    lines = """
    loss_type = "smooth_l1"
    huber_schedule = "exponential"
    huber_c = 0.2
    huber_scale = 1.5
    noise_offset = 0.05
    noise_offset_random_strength = true
    adaptive_noise_scale = -0.01
    multires_noise_iterations = 6
    multires_noise_discount = 0.3
    ip_noise_gamma = 0.1
    ip_noise_gamma_random_strength = true
    min_timestep = 100
    max_timestep = 900
    debiased_estimation_loss = true
    v_pred_like_loss = 0.1
    """
    training = _load(tmp_path, "[training_arguments]\n" + lines.replace("\n    ", "\n"))[0].training
    assert training.loss_type == "smooth_l1" and training.huber_scale == 1.5
    assert training.multires_noise_iterations == 6 and training.max_timestep == 900
    assert training.adaptive_noise_scale == -0.01 and training.debiased_estimation_loss


@pytest.mark.parametrize(
    "lines,expected",
    [
        ('optimizer_args = ["momentum=0.9"]', 'AdamW has no argument "momentum"; accepted: '),
        (
            'optimizer_type = "SGDNesterov"\noptimizer_args = ["nesterov=false"]',
            'SGDNesterov always uses nesterov=True; remove "nesterov"',
        ),
        (
            'optimizer_type = "Prodigy"\noptimizer_args = {d_zero = 1e-6}',
            'Prodigy has no argument "d_zero"',
        ),
    ],
)
def test_bad_optimizer_argument_fails_at_load(tmp_path, lines, expected):
    message, path = _error(tmp_path, lines)
    assert message.startswith(f"config error in {path}: optimizer_args: ") and expected in message
