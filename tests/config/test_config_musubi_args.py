"""musubi-tuner's argument files (and command lines) load: each of its options is one of ours
under its own name, or accepted with a note where it changes nothing here, or refused by name
with the setting that works; never an "unknown key".

The option lists are musubi-tuner's own, read from its parsers (kohya-ss/musubi-tuner,
src/musubi_tuner/training/parser_common.py, qwen_image_train_network.py, qwen_image_train.py,
zimage_train_network.py, zimage_train.py, flux_kontext_train_network.py,
qwen_image/qwen_image_utils.py, and wan_train_network.py for Wan's model options).
"""

from __future__ import annotations

import pytest
from config_helpers import error_of

from library.config import kohya
from library.config.loader import load_config
from library.config.overrides import key_kind

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'


def _words(text: str) -> list[str]:
    return text.split()


# training/parser_common.py: every image and video trainer's options
COMMON = _words("""
config_file dataset_config sdpa flash_attn sage_attn xformers flash3 split_attn compile
compile_backend compile_mode compile_dynamic compile_fullgraph compile_cache_size_limit
cuda_allow_tf32 cuda_cudnn_benchmark dynamo_backend dynamo_mode dynamo_fullgraph dynamo_dynamic
max_train_steps max_train_epochs max_data_loader_n_workers persistent_data_loader_workers seed
gradient_checkpointing gradient_checkpointing_cpu_offload gradient_accumulation_steps
mixed_precision save_precision logging_dir log_with log_prefix log_tracker_name wandb_run_name
log_tracker_config wandb_api_key log_config ddp_timeout ddp_gradient_as_bucket_view
ddp_static_graph sample_every_n_steps sample_at_first sample_every_n_epochs sample_prompts
optimizer_type optimizer_args learning_rate max_grad_norm lr_scheduler lr_warmup_steps
lr_decay_steps lr_scheduler_num_cycles lr_scheduler_power lr_scheduler_timescale
lr_scheduler_min_lr_ratio lr_scheduler_type lr_scheduler_args fp8_base blocks_to_swap
use_pinned_memory_for_block_swap block_swap_h2d_only block_swap_ring_size
img_in_txt_in_offloading disable_numpy_memmap guidance_scale timestep_sampling
discrete_flow_shift sigmoid_scale weighting_scheme logit_mean logit_std mode_scale min_timestep
max_timestep preserve_distribution_shape num_timestep_buckets show_timesteps no_metadata
network_weights network_module network_dim network_alpha network_dropout network_args
training_comment dim_from_weights scale_weight_norms base_weights base_weights_multiplier
output_dir output_name resume save_every_n_epochs save_every_n_steps save_last_n_epochs
save_last_n_epochs_state save_last_n_steps save_last_n_steps_state save_state
save_state_on_train_end metadata_title metadata_author metadata_description metadata_license
metadata_tags metadata_reso metadata_arch huggingface_repo_id huggingface_repo_type
huggingface_path_in_repo huggingface_token huggingface_repo_visibility
save_state_to_huggingface resume_from_huggingface async_upload dit vae vae_dtype
""")
# the image trainers' own options (Qwen-Image and its edit releases, Z-Image, FLUX.1 Kontext;
# the full fine-tunes qwen_image_train.py and zimage_train.py)
IMAGE_TRAINERS = _words("""
fp8_scaled text_encoder fp8_vl num_layers remove_first_image_from_target edit edit_plus
model_version fp8_llm use_32bit_attention text_encoder1 text_encoder2 fp8_t5 full_bf16
fused_backward_pass mem_eff_save block_swap_optimizer_patch_params
""")
# Wan 2.1 / 2.2's model options (wan_train_network.py)
WAN = _words("""
task t5 clip dit_high_noise timestep_boundary offload_inactive_dit vae_cache_cpu one_frame
force_v2_1_time_embedding
""")


@pytest.mark.parametrize("word", sorted(set(COMMON + IMAGE_TRAINERS + WAN)))
def test_every_musubi_tuner_option_is_known(word):
    assert key_kind(kohya.ALIASES.get(word, word)) in ("flat", "default", "unsupported"), word


# Shaped like the Qwen-Image LoRA command musubi-tuner's docs give (docs/qwen_image.md), as an
# args file: its model files, memory and speed switches, the suggested draw and the LoRA.
QWEN_ARGS = """\
dit = "/models/qwen_image_bf16.safetensors"
vae = "/models/qwen_image_vae.safetensors"
text_encoder = "/models/qwen_2.5_vl_7b.safetensors"
dataset_config = "{dataset}"
sdpa = true
split_attn = true
mixed_precision = "bf16"
timestep_sampling = "qwen_shift"
weighting_scheme = "none"
discrete_flow_shift = 2.2
optimizer_type = "adamw8bit"
learning_rate = 5e-5
gradient_checkpointing = true
gradient_checkpointing_cpu_offload = true
max_data_loader_n_workers = 2
persistent_data_loader_workers = true
network_module = "networks.lora_qwen_image"
network_dim = 16
network_args = ["exclude_mod=False", "verbose=True"]
max_train_epochs = 16
save_every_n_epochs = 1
seed = 42
fp8_base = true
fp8_vl = true
blocks_to_swap = 16
use_pinned_memory_for_block_swap = true
cuda_allow_tf32 = true
output_dir = "/out"
output_name = "qwen-lora"
"""


def test_a_musubi_tuner_qwen_image_args_file_loads(write_toml):
    dataset = write_toml("dataset.toml", '[[datasets]]\nimage_directory = "/data/img"\n')
    config = load_config(write_toml("args.toml", QWEN_ARGS.format(dataset=dataset)))
    assert config.model.pretrained_model_name_or_path == "/models/qwen_image_bf16.safetensors"
    assert config.model.vae == "/models/qwen_image_vae.safetensors"
    assert config.flow.text_encoder == "/models/qwen_2.5_vl_7b.safetensors"
    assert config.flow.timestep_sampling == "qwen_shift"
    assert config.flow.exclude_mod is False
    assert config.training.cpu_offload_checkpointing is True
    assert config.network.network_module == "networks.lora_qwen_image"
    notes = " ".join(config.notices)
    for word in ("fp8_vl", "use_pinned_memory_for_block_swap", "cuda_allow_tf32", "split_attn"):
        assert f"{word} = true is ignored" in notes, notes


def test_musubi_tuner_words_work_on_the_command_line(write_toml):
    config = load_config(
        write_toml("a.toml", DATASET),
        [("dit", "/models/z_image_turbo_bf16.safetensors"), ("flash_attn", None)],
    )
    assert config.model.pretrained_model_name_or_path == "/models/z_image_turbo_bf16.safetensors"


def test_kontexts_text_encoders_are_flux_keys(write_toml):
    text = (
        'dit = "/m/flux1-kontext-dev.safetensors"\ntext_encoder1 = "/m/t5xxl.safetensors"\n'
        'text_encoder2 = "/m/clip_l.safetensors"\n' + DATASET
    )
    config = load_config(write_toml("a.toml", text))
    assert (config.flow.t5xxl, config.flow.clip_l) == (
        "/m/t5xxl.safetensors",
        "/m/clip_l.safetensors",
    )


def test_wan_words_load_as_difftune_keys(write_toml):
    """musubi-tuner's Wan trainer's t5 and task, and its network module."""
    text = (HEAD + 't5 = "/m/umt5.safetensors"\ntask = "t2v-1.3B"\n'
            'network_module = "networks.lora_wan"\n' + DATASET)  # fmt: skip
    config = load_config(write_toml("a.toml", text))
    assert (config.flow.t5, config.flow.task) == ("/m/umt5.safetensors", "t2v-1.3B")
    assert config.network.network_module == "networks.lora_wan"


def test_wan_21_image_to_video_words_load(write_toml):
    """musubi-tuner's Wan 2.1 I2V-14B words: its task and the CLIP vision file (clip)."""
    text = HEAD + 'clip = "/m/clip_vision_h.safetensors"\ntask = "i2v-14B"\n' + DATASET
    config = load_config(write_toml("a.toml", text))
    assert (config.flow.clip, config.flow.task) == ("/m/clip_vision_h.safetensors", "i2v-14B")


def test_dit_and_the_model_key_must_agree(write_toml):
    message = error_of(write_toml("a.toml", HEAD + 'dit = "other"\n' + DATASET))
    assert "set twice with different values" in message


def test_wan_22_expert_run_words_load(write_toml):
    """A Wan 2.2 expert run's words as users' scripts carry them: the level drawn again into
    min_timestep..max_timestep, and Wan 2.1's time embedding (the same result here)."""
    text = (HEAD + 'task = "t2v-A14B"\nmin_timestep = 875\nmax_timestep = 1000\n'
            "preserve_distribution_shape = true\nforce_v2_1_time_embedding = true\n" + DATASET)  # fmt: skip
    config = load_config(write_toml("a.toml", text))
    assert config.training.preserve_distribution_shape is True
    assert (config.training.min_timestep, config.training.max_timestep) == (875, 1000)
    notes = " ".join(config.notices)
    assert "force_v2_1_time_embedding = true is ignored" in notes, notes
    assert "shares its sample's time" in notes


@pytest.mark.parametrize(
    ("line", "fix"),
    [
        ("fp8_scaled = true", "fp8_base = true"),
        ("edit = true", 'model_version = "edit"'),
        ("edit_plus = true", 'model_version = "edit-2509"'),
        ("num_timestep_buckets = 4", "timestep_sampling"),
        ("use_32bit_attention = true", 'mixed_precision = "no"'),
        ('timestep_sampling = "qinglong_qwen"', "use qwen_shift"),
        ('timestep_sampling = "logsnr"', "use qwen_shift"),
        ('timestep_sampling = "ideogram4_shift"', "use qwen_shift"),
        ('network_module = "networks.lokr"', '"lycoris.kohya" and network_args = ["algo=lokr"]'),
        ('save_precision = "fp32"', 'write "float"'),
        ('lr_scheduler = "rex"', "cosine_with_min_lr"),
        ("network_args = [\"exclude_patterns=['.*mlp.*']\"]", "exclude_mod=False"),
    ],
)
def test_what_difftune_does_not_do_is_refused_with_the_setting_that_works(write_toml, line, fix):
    message = error_of(write_toml("a.toml", HEAD + line + "\n" + DATASET))
    assert fix in message, message
    assert "unknown key" not in message


@pytest.mark.parametrize(
    "line",
    [
        "flash_attn = false",
        "fp8_scaled = false",
        "edit = false",
        "block_swap_ring_size = 2",
        'dynamo_backend = "NO"',  # musubi-tuner's default
        'vae_dtype = "bfloat16"',
        "num_layers = 60",
        "remove_first_image_from_target = true",  # only the layered model reads it
    ],
)
def test_what_changes_nothing_loads(write_toml, line):
    assert load_config(write_toml("a.toml", HEAD + line + "\n" + DATASET))


def test_the_compatibility_page_lists_every_word():
    from pathlib import Path

    from library.config import musubi_args

    page = (Path(__file__).parents[2] / "docs" / "compatibility.md").read_text(encoding="utf-8")
    section = page.split("## musubi-tuner's argument files")[1].split("\n## ")[0]
    words = [
        *musubi_args.ALIASES,
        *musubi_args.UNSUPPORTED,
        *musubi_args.REFUSED_NETWORK_ARGS,
        *musubi_args.OFF_NETWORK_ARGS,
        *(value for values in musubi_args.UNSUPPORTED_VALUES.values() for value in values),
    ]
    missing = [
        w for w in words if f"`{w}`" not in section and f"`{w.split('.')[-1]}`" not in section
    ]
    assert not missing, missing


@pytest.mark.parametrize(("line", "value"), [("timestep_boundary = 875", 875.0), ("timestep_boundary = 0.9", 0.9)])
def test_musubi_tuners_expert_words_are_the_experts_keys(write_toml, line, value):
    """Its Wan 2.2 two-expert words land in [experts] as written (the scales are read there)."""
    config = load_config(write_toml("a.toml", HEAD + line + "\noffload_inactive_dit = true\n" + DATASET))
    assert config.experts.timestep_boundary == value
    assert config.experts.offload_inactive_dit is True
