"""kohya helpers: k=v argument parsing, network_args, optimizer names, the unsupported-key table."""

from __future__ import annotations

import pytest

from library.config import kohya
from library.config.overrides import DATASET_KEYS, SUBSET_KEYS
from library.config.schema import field_sections
from library.errors import ConfigError


def test_parse_kv_args_values():
    got = kohya.parse_kv_args(
        [
            "weight_decay=0.01",
            "betas=0.9,0.99",
            "eps=1e-8",
            "amsgrad=True",
            "foreach=false",
            "n=3",
            "name=adam",
            "quoted='x y'",
            "tuple=(0.9, 0.999)",
            "nothing=None",
        ]
    )
    assert got == {
        "weight_decay": 0.01,
        "betas": (0.9, 0.99),
        "eps": 1e-8,
        "amsgrad": True,
        "foreach": False,
        "n": 3,
        "name": "adam",
        "quoted": "x y",
        "tuple": (0.9, 0.999),
        "nothing": None,
    }
    assert type(got["n"]) is int


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["weight_decay"], 'optimizer_args item "weight_decay" is not "key=value"'),
        (["=1"], 'item "=1" is not'),
        (["a="], 'item "a=" is not'),
        (["a=1", "a=2"], 'sets "a" twice'),
        (["a=1,,2"], "empty value"),
    ],
)
def test_parse_kv_args_errors_name_the_item(items, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        kohya.parse_kv_args(items)


def test_network_args_values():
    assert kohya.network_args_values(["conv_dim=8", " conv_alpha = 0.5"]) == {
        "conv_dim": 8,
        "conv_alpha": 0.5,
    }
    assert kohya.network_args_values(["algo=locon", "dropout=0", "use_cp=True"]) == {
        "algo": "locon",
        "use_tucker": True,
    }
    for item in ("dropout=0.1", "made_up=1"):
        with pytest.raises(ConfigError, match=f'network_args "{item}" is not supported'):
            kohya.network_args_values([item])


@pytest.mark.parametrize(
    ("name", "expected"),
    [("adamw8bit", "AdamW8bit"), ("ADAMW", "AdamW"), ("AdamW", "AdamW"), ("Lion", "Lion")],
)
def test_optimizer_names_are_case_insensitive(name, expected):
    assert kohya.normalise_optimizer(name) == expected


def test_unsupported_values_of_supported_keys():
    for name in ("DAdaptAdam", "DAdaptation", "dadaptlion"):
        assert "is not supported" in kohya.unsupported_value_problem("optimizer_type", name)
    for name in ("Lion", "Prodigy", "Adafactor", "PagedAdamW8bit", "bitsandbytes.optim.Lion"):
        assert kohya.unsupported_value_problem("optimizer_type", name) is None
    assert kohya.unsupported_value_problem("network_module", "lycoris.kohya") is None
    for module in ("networks.dylora", "networks.oft"):
        assert "is not supported" in kohya.unsupported_value_problem("network_module", module)
    assert kohya.unsupported_value_problem("optimizer_type", "AdamW") is None


def test_off_values_match_by_type():
    assert kohya.unsupported_problem("network_dropout", 0) is None
    assert kohya.unsupported_problem("network_dropout", False) is not None  # False is not 0 here
    assert kohya.unsupported_problem("save_n_epoch_ratio", 0.0) is None
    assert kohya.unsupported_problem("weighted_captions", 0) is not None  # 0 is not false here
    assert kohya.unsupported_problem("base_weights_multiplier", 0.5) is None  # needs base_weights


# The kohya keys of docs/formats.md (training-arguments and dataset TOML) and other common ones,
# written out by hand.
_FORMATS_TEXT = """
pretrained_model_name_or_path v2 v_parameterization vae output_dir output_name save_model_as
save_precision save_every_n_epochs save_every_n_steps save_last_n_epochs save_state resume
train_batch_size max_train_steps max_train_epochs gradient_accumulation_steps
gradient_checkpointing mixed_precision seed learning_rate unet_lr text_encoder_lr lr_scheduler
lr_warmup_steps lr_scheduler_num_cycles optimizer_type optimizer_args max_grad_norm
network_module network_dim network_alpha network_args network_weights network_train_unet_only
network_train_text_encoder_only noise_offset min_snr_gamma clip_skip caption_extension
shuffle_caption keep_tokens resolution enable_bucket cache_latents cache_latents_to_disk
train_data_dir reg_data_dir prior_loss_weight dataset_config sample_prompts sample_every_n_steps
sample_every_n_epochs sample_sampler logging_dir log_with sdpa xformers
batch_size min_bucket_reso max_bucket_reso bucket_reso_steps bucket_no_upscale validation_split
validation_seed num_repeats keep_tokens_separator caption_separator caption_prefix
caption_suffix caption_dropout_rate caption_dropout_every_n_epochs caption_tag_dropout_rate
flip_aug color_aug random_crop token_warmup_min token_warmup_step image_dir class_tokens is_reg
alpha_mask metadata_file
mem_eff_attn full_fp16 full_bf16 lowram highvram in_json dataset_repeats dim_from_weights
network_dropout scale_weight_norms save_last_n_steps_state save_last_n_epochs_state
wandb_api_key huggingface_repo_id max_token_length cache_text_encoder_outputs
"""
FORMATS_KEYS = _FORMATS_TEXT.split()


def test_every_documented_kohya_key_is_known():
    known = set(field_sections()) | set(kohya.UNSUPPORTED) | set(DATASET_KEYS) | set(SUBSET_KEYS)
    assert sorted(k for k in FORMATS_KEYS if k not in known) == []
    # An unsupported key must not shadow a schema key (it would never be reached).
    assert set(kohya.UNSUPPORTED).isdisjoint(field_sections())


def test_unsupported_entries_are_honest():
    for key, entry in kohya.UNSUPPORTED.items():
        assert entry.reason, key
        if not entry.ignored and entry.off:
            assert kohya.unsupported_problem(key, entry.off[0]) is None, key
