"""LyCORIS' and networks.lora's block-wise network_args: read as the GUIs write them, every value
checked, and anything difftune does not do refused by name in one line."""

from __future__ import annotations

import pytest

from library.config.loader import load_config
from tests.config.config_helpers import error_of

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'

# The network_args strings the kohya_ss GUI builds for its LyCORIS types (kohya_gui/lora_gui.py,
# the "LyCORIS/LoHa" and "LyCORIS/LoKr" branches), split into a list as its TOML export does.
# Every option is written, off or not; use_tucker appears twice in the GUI's own string.
GUI_LOHA = [
    "preset=full",
    "conv_dim=8",
    "conv_alpha=4",
    "use_tucker=False",
    "rank_dropout=0",
    "bypass_mode=False",
    "dora_wd=True",
    "module_dropout=0",
    "use_tucker=False",
    "use_scalar=False",
    "rank_dropout_scale=False",
    "algo=loha",
    "train_norm=False",
]
GUI_LOKR = [
    "preset=attn-mlp",
    "conv_dim=4",
    "conv_alpha=1",
    "use_tucker=False",
    "rank_dropout=0.0",
    "bypass_mode=False",
    "dora_wd=False",
    "module_dropout=0.0",
    "factor=8",
    "use_cp=True",
    "use_scalar=False",
    "decompose_both=True",
    "rank_dropout_scale=False",
    "algo=lokr",
    "train_norm=False",
]


def _load(write_toml, lines: str):
    return load_config(write_toml("c.toml", HEAD + lines + "\n" + DATASET))


def _args(items: list[str]) -> str:
    return "network_args = [" + ", ".join(f'"{i}"' for i in items) + "]"


def test_gui_loha_args_are_read(write_toml):
    config = _load(write_toml, 'network_module = "lycoris.kohya"\n' + _args(GUI_LOHA))
    adapter = config.adapter
    assert (adapter.algo, adapter.preset, adapter.dora_wd) == ("loha", "full", True)
    assert adapter.use_tucker is False and adapter.use_scalar is False
    assert (config.network.conv_dim, config.network.conv_alpha) == (8, 4.0)


def test_gui_lokr_args_are_read_and_tucker_aliases_combine(write_toml):
    config = _load(write_toml, 'network_module = "lycoris.kohya"\n' + _args(GUI_LOKR))
    adapter = config.adapter
    assert (adapter.algo, adapter.factor, adapter.decompose_both) == ("lokr", 8, True)
    # LyCORIS turns Tucker on when any of use_tucker / use_cp / use_conv_cp is on
    assert adapter.use_tucker is True


def test_keys_may_be_written_outside_network_args(write_toml):
    config = _load(
        write_toml,
        'network_module = "lycoris.kohya"\n[adapter]\nalgo = "lokr"\nfactor = 4\nfull_matrix = true',
    )
    assert (config.adapter.algo, config.adapter.factor, config.adapter.full_matrix) == (
        "lokr",
        4,
        True,
    )


def test_blockwise_args_are_read(write_toml):
    dims = ",".join(["2"] * 25)
    config = _load(
        write_toml,
        _args([f"block_dims={dims}", "down_lr_weight=sine+0.5", "mid_lr_weight=2.0"]),
    )
    assert config.adapter.block_dims == [2] * 25
    assert config.adapter.down_lr_weight == "sine+0.5" and config.adapter.mid_lr_weight == 2.0


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            'network_module = "lycoris.kohya"\n' + _args(["rank_dropout=0.1"]),
            'network_args "rank_dropout=0.1" is not supported (dropout inside adapters is planned)'
            "; remove it or set rank_dropout=0",
        ),
        (
            'network_module = "lycoris.kohya"\n' + _args(["train_norm=True"]),
            "norm-layer adapters are planned",
        ),
        (
            'network_module = "lycoris.kohya"\n' + _args(["bypass_mode=True"]),
            "bypass mode is not supported",
        ),
        ('network_module = "lycoris.kohya"\n' + _args(["algo=dylora"]), "DyLoRA is not supported"),
        ('network_module = "lycoris.kohya"\n[adapter]\nalgo = "glora"', "GLoRA is not supported"),
        (
            'network_module = "lycoris.kohya"\n' + _args(["preset=my_preset.toml"]),
            "preset",
        ),
        (_args(["algo=loha"]), 'algo is a LyCORIS option; set network_module = "lycoris.kohya"'),
        (
            'network_module = "lycoris.kohya"\n' + _args(["block_dims=1,2"]),
            "block_dims is a block-wise option of networks.lora, which LyCORIS does not read",
        ),
        (
            'network_module = "lycoris.kohya"\n' + _args(["algo=loha", "algo=lokr"]),
            'network_args sets "algo" twice, to "loha" and "lokr"; keep one',
        ),
        (
            'network_module = "lycoris.kohya"\ntrain_mode = "unet"',
            'network_module = "lycoris.kohya" trains an adapter',
        ),
        (_args(["disable_conv_cp=False"]), "write use_tucker instead"),
    ],
)
def test_refusals_name_the_argument(write_toml, lines, expected):
    message = error_of(write_toml("c.toml", HEAD + lines + "\n" + DATASET))
    assert expected in message, message
