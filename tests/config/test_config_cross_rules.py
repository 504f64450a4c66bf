"""Rules that involve several sections surface as one-line ConfigErrors naming the file."""

import pytest

from library.config.loader import load_config
from library.errors import ConfigError


def test_network_weights_with_full_unet(tmp_path):
    (tmp_path / "imgs").mkdir()
    path = tmp_path / "c.toml"
    path.write_text(
        'pretrained_model_name_or_path = "m"\ntrain_mode = "unet"\nnetwork_weights = "x.safetensors"\n'
        f'[[datasets]]\n[[datasets.subsets]]\nimage_dir = "{tmp_path / "imgs"}"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert str(path) in str(err.value) and "network_weights starts a LoRA" in str(err.value)
    assert "\n" not in str(err.value)


def test_unet_only_and_text_encoder_only_together(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        'pretrained_model_name_or_path = "m"\nnetwork_train_unet_only = true\n'
        "network_train_text_encoder_only = true\n"
        '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "i"\n'
    )
    with pytest.raises(ConfigError, match="set at most one"):
        load_config(str(path))


def test_any_torch_optimizer_by_class_name():
    import torch

    from library.config.schema import OptimizerSection
    from library.training.optimizers import build_optimizer

    section = OptimizerSection(optimizer_type="RMSprop", optimizer_args=["alpha=0.9"])
    assert section.optimizer_type == "torch.optim.RMSprop"
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = build_optimizer(section, [{"params": [param], "lr": 0.1, "name": "unet"}])
    assert isinstance(optimizer, torch.optim.RMSprop) and optimizer.param_groups[0]["alpha"] == 0.9


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ('base_model_precision = "nf4-bnb"', 'base_model_precision = "nf4-bnb" stores frozen'),
        ('base_model_precision = "int8-bnb"', 'base_model_precision = "int8-bnb" stores frozen'),
        ("fp8_base = true", "fp8_base stores frozen weights in float8"),
        ("fp8_base_unet = true", "fp8_base_unet stores frozen weights in float8"),
        ("loraplus_lr_ratio = 16", "loraplus_lr_ratio is for LoRA up/down weights"),
    ],
)
def test_what_a_full_fine_tune_cannot_apply_is_refused_with_the_config(tmp_path, keys, expected):
    """Found by the config check, not after the text encoders are loaded: the model path does
    not even exist here."""
    path = tmp_path / "c.toml"
    path.write_text(
        f'pretrained_model_name_or_path = "no-such-model"\ntrain_mode = "unet"\n{keys}\n'
        '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "i"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    message = str(err.value)
    assert message.startswith(f"config error in {path}: ") and expected in message
    assert 'with train_mode = "unet"' in message and "\n" not in message
