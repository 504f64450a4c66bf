"""kohya files load to the values a kohya user means: flat args presets and dataset TOMLs."""

from __future__ import annotations

import pytest

from library.config import dataset_loader
from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.config.loader import load_config

KOHYA_PRESET = """\
# a user's LoRA preset, as kohya's GUI and guides write them
[model_arguments]
pretrained_model_name_or_path = "/models/v1-5-pruned"
v2 = false
v_parameterization = false

[additional_network_arguments]
network_module = "networks.lora"
network_dim = 32
network_alpha = 16
network_args = ["conv_dim=8", "conv_alpha=4"]
network_train_unet_only = true
unet_lr = 1e-4
text_encoder_lr = 5e-5

[optimizer_arguments]
optimizer_type = "adamw8bit"
learning_rate = 0.0001
max_grad_norm = 1.0
lr_scheduler = "cosine_with_restarts"
lr_warmup_steps = 100
lr_scheduler_num_cycles = 3
optimizer_args = ["weight_decay=0.01", "betas=0.9,0.99"]

[training_arguments]
train_batch_size = 2
max_train_epochs = 10
gradient_accumulation_steps = 2
gradient_checkpointing = true
mixed_precision = "fp16"
seed = 1234
xformers = false
sdpa = true
lowram = false
noise_offset = 0.05
min_snr_gamma = 5
max_data_loader_n_workers = 0
clip_skip = 1
max_token_length = 75
cache_text_encoder_outputs = false

[saving_arguments]
output_dir = "./output"
output_name = "my_lora"
save_model_as = "safetensors"
save_precision = "fp16"
save_every_n_epochs = 2
save_state = false

[dataset_arguments]
train_data_dir = "./train"
resolution = "768,512"
caption_extension = ".caption"
enable_bucket = false
min_bucket_reso = 256
max_bucket_reso = 1024
bucket_reso_steps = 64
cache_latents = false
shuffle_caption = false
keep_tokens = 0
flip_aug = false
color_aug = false

[sample_prompt_arguments]
sample_every_n_epochs = 1
sample_sampler = "euler_a"

[logging_arguments]
log_with = "tensorboard"
logging_dir = "./logs"
log_prefix = "my_lora"
"""


@pytest.fixture
def fake_folders(monkeypatch):
    """Replace library.data.folders.dreambooth_subsets; records its calls."""
    calls = []

    def dreambooth_subsets(train_data_dir, reg_data_dir, skipped=None):
        calls.append((train_data_dir, reg_data_dir))
        subsets = [
            {
                "image_dir": f"{train_data_dir}/10_sks dog",
                "class_tokens": "sks dog",
                "num_repeats": 10,
                "is_reg": False,
            },
        ]
        if reg_data_dir is not None:
            subsets.append(
                {
                    "image_dir": f"{reg_data_dir}/1_dog",
                    "class_tokens": "dog",
                    "num_repeats": 1,
                    "is_reg": True,
                }
            )
        return subsets

    monkeypatch.setattr(dataset_loader, "dreambooth_subsets", dreambooth_subsets)
    return calls


def test_kohya_preset_loads_to_the_meant_values(write_toml, fake_folders):
    cfg = load_config(write_toml("preset.toml", KOHYA_PRESET))
    assert cfg.model.pretrained_model_name_or_path == "/models/v1-5-pruned"
    assert (cfg.model.v2, cfg.model.v_parameterization) == (False, False)
    net = cfg.network
    assert (net.network_dim, net.network_alpha) == (32, 16.0)
    assert (net.conv_dim, net.conv_alpha) == (8, 4.0)
    assert net.network_train_unet_only is True
    assert (net.unet_lr, net.text_encoder_lr) == (1e-4, 5e-5)
    opt = cfg.optimizer
    assert opt.optimizer_type == "AdamW8bit"
    assert opt.optimizer_args == ["weight_decay=0.01", "betas=0.9,0.99"]
    assert (opt.learning_rate, opt.lr_scheduler) == (1e-4, "cosine_with_restarts")
    assert (opt.lr_warmup_steps, opt.lr_scheduler_num_cycles) == (100, 3)
    tr = cfg.training
    assert (tr.train_batch_size, tr.max_train_epochs, tr.gradient_accumulation_steps) == (2, 10, 2)
    assert (tr.gradient_checkpointing, tr.mixed_precision, tr.seed) == (True, "fp16", 1234)
    assert (tr.noise_offset, tr.min_snr_gamma) == (0.05, 5.0)
    sv = cfg.saving
    assert (sv.output_dir, sv.output_name, sv.save_precision) == ("./output", "my_lora", "fp16")
    assert sv.save_every_n_epochs == 2
    assert (cfg.logging.log_with, cfg.logging.logging_dir) == ("tensorboard", "./logs")
    # Paths stay as written; the folder layout is expanded with the flat dataset defaults.
    assert fake_folders == [("./train", None)]
    assert cfg.datasets == [
        DatasetConfig(
            batch_size=2,
            resolution=[768, 512],
            subsets=[
                SubsetConfig(
                    image_dir="./train/10_sks dog",
                    class_tokens="sks dog",
                    caption_extension=".caption",
                    num_repeats=10,
                    is_reg=False,
                )
            ],
        )
    ]


def test_reg_data_dir_adds_reg_subsets(write_toml, fake_folders):
    path = write_toml(
        "a.toml",
        """\
        pretrained_model_name_or_path = "m"
        train_data_dir = "t"
        reg_data_dir = "r"
        """,
    )
    cfg = load_config(path)
    assert fake_folders == [("t", "r")]
    assert [(s.image_dir, s.is_reg, s.num_repeats) for s in cfg.datasets[0].subsets] == [
        ("t/10_sks dog", False, 10),
        ("r/1_dog", True, 1),
    ]


def test_folder_without_class_tokens_takes_them_from_general(write_toml, monkeypatch):
    monkeypatch.setattr(
        dataset_loader,
        "dreambooth_subsets",
        lambda train, reg, skipped=None: [
            {"image_dir": f"{train}/5", "class_tokens": None, "num_repeats": 5, "is_reg": False}
        ],
    )
    path = write_toml(
        "a.toml",
        'pretrained_model_name_or_path = "m"\ntrain_data_dir = "t"\n'
        '[general]\nclass_tokens = "ohwx"\nbatch_size = 2\n',
    )
    cfg = load_config(path)
    assert cfg.datasets[0].batch_size == 2
    assert cfg.datasets[0].subsets[0].class_tokens == "ohwx"


def test_train_data_dir_with_real_folders(tmp_path, monkeypatch, write_toml):
    pytest.importorskip("library.data.folders")
    for name in ("10_sks dog", "3_sks cat"):
        (tmp_path / "train" / name).mkdir(parents=True)
        (tmp_path / "train" / name / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    path = write_toml("a.toml", 'pretrained_model_name_or_path = "m"\ntrain_data_dir = "train"\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(path)
    got = sorted(
        (s.image_dir.replace("\\", "/"), s.class_tokens, s.num_repeats)
        for s in cfg.datasets[0].subsets
    )
    assert got == [("train/10_sks dog", "sks dog", 10), ("train/3_sks cat", "sks cat", 3)]


DATASET_TOML = """\
[general]
caption_extension = ".cap"
class_tokens = "general tokens"
batch_size = 3
shuffle_caption = false
keep_tokens = 0

[[datasets]]
resolution = [768, 512]
batch_size = 4

  [[datasets.subsets]]
  image_dir = "/data/dog"
  class_tokens = "sks dog"
  num_repeats = 10

  [[datasets.subsets]]
  image_dir = "/data/dog_cap"
  caption_extension = ".txt"

  [[datasets.subsets]]
  is_reg = true
  image_dir = "/data/reg"
  class_tokens = "dog"
  num_repeats = 1

[[datasets]]
caption_extension = ".ds"

  [[datasets.subsets]]
  image_dir = "/data/style"
  num_repeats = 2
"""


def test_dataset_config_precedence(write_toml):
    dataset_path = write_toml("dataset.toml", DATASET_TOML)
    path = write_toml(
        "args.toml",
        f"""\
        [model]
        pretrained_model_name_or_path = "m"
        [data]
        dataset_config = {dataset_path!r}
        resolution = 640
        caption_extension = ".flat"
        [training]
        train_batch_size = 7
        """,
    )
    cfg = load_config(path)
    # subset > dataset > [general] > flat args > default, worked out by hand from the files.
    expected = [
        DatasetConfig(
            batch_size=4,
            resolution=[768, 512],
            subsets=[
                SubsetConfig(
                    image_dir="/data/dog",
                    class_tokens="sks dog",
                    caption_extension=".cap",
                    num_repeats=10,
                    is_reg=False,
                ),
                SubsetConfig(
                    image_dir="/data/dog_cap",
                    class_tokens="general tokens",
                    caption_extension=".txt",
                    num_repeats=1,
                    is_reg=False,
                ),
                SubsetConfig(
                    image_dir="/data/reg",
                    class_tokens="dog",
                    caption_extension=".cap",
                    num_repeats=1,
                    is_reg=True,
                ),
            ],
        ),
        DatasetConfig(
            batch_size=3,
            resolution=[640, 640],
            subsets=[
                SubsetConfig(
                    image_dir="/data/style",
                    class_tokens="general tokens",
                    caption_extension=".ds",
                    num_repeats=2,
                    is_reg=False,
                ),
            ],
        ),
    ]
    assert cfg.datasets == expected
    assert cfg.data.dataset_config == dataset_path


def test_inline_datasets_use_flat_defaults(write_toml):
    path = write_toml(
        "a.toml",
        """\
        pretrained_model_name_or_path = "m"
        train_batch_size = 5
        resolution = [512, 768]

        [[datasets]]
          [[datasets.subsets]]
          image_dir = "a"
          caption_extention = ".caption"   # kohya's misspelled alias

        [[datasets]]
        resolution = 1024
        batch_size = 1
          [[datasets.subsets]]
          image_dir = "b"
        """,
    )
    cfg = load_config(path)
    assert [(d.batch_size, d.resolution) for d in cfg.datasets] == [
        (5, [512, 768]),
        (1, [1024, 1024]),
    ]
    assert [d.subsets[0].caption_extension for d in cfg.datasets] == [".caption", ".txt"]


def test_general_table_in_args_file_holds_dataset_and_plain_keys(write_toml):
    # kohya presets sometimes name a table [general]; plain keys there stay plain arguments.
    path = write_toml(
        "a.toml",
        """\
        [general]
        pretrained_model_name_or_path = "m"
        seed = 9
        num_repeats = 4
        [[datasets]]
          [[datasets.subsets]]
          image_dir = "a"
        """,
    )
    cfg = load_config(path)
    assert cfg.training.seed == 9
    assert cfg.datasets[0].subsets[0].num_repeats == 4


def test_tables_named_like_keys_are_groups(write_toml):
    """kohya flattens every table of an args file: a GUI's [dataset_config] and [log_config]
    group keys (the keys of those names are a string and a flag, never a table)."""
    dataset = write_toml(
        "dataset.toml", '[[datasets]]\nresolution = 768\n[[datasets.subsets]]\nimage_dir = "a"\n'
    )
    path = write_toml(
        "gui.toml",
        f"""\
        [model]
        pretrained_model_name_or_path = "m"
        [dataset_config]
        dataset_config = "{dataset}"
        caption_extension = ".caption"
        [log_config]
        log_config = true
        logging_dir = "logs"
        log_with = "tensorboard"
        [optimizer_args]
        weight_decay = 0.05
        """,
    )
    cfg = load_config(path)
    assert list(cfg.datasets[0].resolution) == [768, 768]
    assert cfg.datasets[0].subsets[0].caption_extension == ".caption"
    assert cfg.logging.log_config is True and cfg.logging.logging_dir == "logs"
    assert cfg.logging.log_with == "tensorboard"
    # a key whose value may be a table keeps its table
    assert cfg.optimizer.optimizer_args == {"weight_decay": 0.05}


def test_config_is_frozen(write_toml):
    cfg = load_config(
        write_toml(
            "a.toml",
            'pretrained_model_name_or_path = "m"\n'
            '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "a"\n',
        )
    )
    with pytest.raises(ValueError):
        cfg.training.seed = 1
    with pytest.raises(ValueError):
        cfg.datasets[0].subsets[0].num_repeats = 3
