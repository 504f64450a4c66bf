"""musubi-tuner's training options: the words of its argument files that difftune reads.

musubi-tuner (kohya's trainer for the video and edit models) takes its options on the command
line or from a TOML args file (``--config_file``), flattened into one namespace as sd-scripts
does. Most of its words are sd-scripts' and mean what they mean there (``network_dim``,
``timestep_sampling``, ``blocks_to_swap``, ...). These tables hold the others, from its common
parser (training/parser_common.py) and its image trainers for Qwen-Image (and its edit
releases), Z-Image and FLUX.1 Kontext (``*_train_network.py``, and the full fine-tunes
``qwen_image_train.py`` / ``zimage_train.py``):

- ``ALIASES``: a word for one of difftune's keys (``dit`` is the model file);
- ``UNSUPPORTED``: known by name (see library.config.unsupported): speed and loading switches of
  musubi-tuner that change no result here are accepted with a note, and options difftune does
  not implement are refused with the nearest setting that works (the options of one model's
  trainer are that family's entry's: its kohya vocabulary);
- ``UNSUPPORTED_VALUES``: values of shared keys that only musubi-tuner has.

kohya.py merges them into its own tables, so a musubi-tuner word is never an "unknown key".
"""

from __future__ import annotations

from library.config.unsupported import Unsupported, group

# musubi-tuner's word -> ours
# (The words of one model's trainer are that family's: its entry's kohya vocabulary.)
ALIASES: dict[str, str] = {
    "dit": "pretrained_model_name_or_path",
    "gradient_checkpointing_cpu_offload": "cpu_offload_checkpointing",
}

_SPEED = "it only changes how fast musubi-tuner runs or loads; the result is the same"
_ATTENTION = (
    "difftune computes attention with PyTorch's scaled-dot-product attention, which picks a "
    "flash or memory-efficient kernel itself"
)
_BLOCK_SWAP = (
    "it tunes how musubi-tuner copies swapped blocks; difftune's blocks_to_swap copies them "
    "itself, with the same result"
)
_TEXT_FP8 = (
    "a float8 text encoder; difftune stores the text encoders in float8 with fp8_base (which "
    "also covers the transformer, as musubi-tuner's fp8_base does), and the captions are "
    "encoded once either way"
)

UNSUPPORTED: dict[str, Unsupported] = {
    # attention kernels: the result is the same attention
    **group("flash_attn flash3 sage_attn", _ATTENTION, (False,), ignored=True),
    "split_attn": Unsupported(
        "musubi-tuner (and sd-scripts' Anima and HunyuanImage training) computes attention one "
        "sample at a time to save memory; difftune computes the same attention for the whole "
        "batch, its captions masked",
        (False,),
        ignored=True,
    ),
    **group(
        "cuda_allow_tf32 cuda_cudnn_benchmark disable_numpy_memmap img_in_txt_in_offloading",
        _SPEED,
        (False,),
        ignored=True,
    ),
    **group(
        "dynamo_mode dynamo_fullgraph dynamo_dynamic",
        "it only acts with dynamo_backend (torch.compile), which difftune does not use",
        (False, "", "default"),
        ignored=True,
    ),
    **group(
        "use_pinned_memory_for_block_swap block_swap_h2d_only block_swap_optimizer_patch_params",
        _BLOCK_SWAP,
        (False,),
        ignored=True,
    ),
    "block_swap_ring_size": Unsupported(_BLOCK_SWAP, (2,), ignored=True),
    # float8 text encoders of Qwen-Image (fp8_vl), Z-Image (fp8_llm), Kontext and Wan (fp8_t5);
    # sd-scripts' HunyuanImage training has fp8_vl too
    **group("fp8_vl fp8_llm fp8_t5", _TEXT_FP8, (False,), ignored=True),
    "fp8_scaled": Unsupported(
        "float8 weights with musubi-tuner's per-block scales (and sd-scripts' HunyuanImage "
        "training's) are not read or made here; fp8_base = true alone stores the frozen "
        "weights in float8",
        (False,),
        planned=False,
    ),
    "vae_dtype": Unsupported(
        "difftune runs the VAE in the weight dtype, or float32 with no_half_vae = true",
        ("",),
        ignored=True,
    ),
    "num_layers": Unsupported(
        "difftune counts the transformer's blocks in the model file itself", ("",), ignored=True
    ),
    **group(
        "metadata_arch metadata_reso",
        (
            "difftune writes the model's architecture and the trained resolution into the "
            "file's metadata itself"
        ),
        ("",),
        ignored=True,
    ),
    "num_timestep_buckets": Unsupported(
        "stratified timestep draws are not supported: each sample's noise level is drawn on "
        "its own (timestep_sampling)",
        planned=False,
    ),
}

_LYCORIS_MODULES = {
    "networks.loha": "loha",
    "networks.lokr": "lokr",
}

UNSUPPORTED_VALUES: dict[str, dict[str, str]] = {
    "timestep_sampling": {
        **{
            name: f"{label}; use qwen_shift or flux_shift (the two resolution-dependent "
            "shifts) or shift with discrete_flow_shift"
            for name, label in {
                "ideogram4_shift": "Ideogram 4's shift (musubi-tuner)",
                "qinglong_flux": "musubi-tuner's mix of flux_shift and two logSNR draws",
                "qinglong_qwen": "musubi-tuner's mix of qwen_shift and a logSNR draw",
                "logsnr": "musubi-tuner's logSNR draw",
            }.items()
        },
    },
    "network_module": {
        **{
            f"networks.lora_{name}": f"musubi-tuner's LoRA of {label}, a model difftune does "
            "not train"
            for name, label in {
                "framepack": "FramePack",
                "hv_1_5": "HunyuanVideo 1.5",
                "kandinsky": "Kandinsky 5",
                "hidream_o1": "HiDream-O1",
                "ideogram4": "Ideogram 4",
            }.items()
        },
        **{
            module: f'musubi-tuner\'s own {algo}; write network_module = "lycoris.kohya" and '
            f'network_args = ["algo={algo}"] (LyCORIS\' {algo})'
            for module, algo in _LYCORIS_MODULES.items()
        },
    },
    "save_precision": {"fp32": 'write "float" (musubi-tuner\'s fp32)'},
    "lr_scheduler": {
        "rex": "musubi-tuner's REX schedule is not supported; cosine_with_min_lr or linear decay "
        "instead"
    },
}

_PATTERNS = (
    "musubi-tuner's regular-expression choice of the adapted modules is not supported yet; "
    "the default set is musubi-tuner's (where a LoRA leaves out the blocks' modulation, "
    "exclude_mod=False adds it)"
)
# network_args of musubi-tuner's LoRA modules: argument -> why it is refused
REFUSED_NETWORK_ARGS: dict[str, str] = {
    "exclude_patterns": _PATTERNS,
    "include_patterns": _PATTERNS,
}
# ... and those accepted with any value (off values, why another is refused)
OFF_NETWORK_ARGS: dict[str, tuple[tuple[object, ...], str]] = {
    # it only prints the adapted modules
    "verbose": ((False, True, None), "it only prints the adapted modules"),
}
