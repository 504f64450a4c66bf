"""Options of sd-scripts' scripts for trainings difftune does not do, and of newer releases.

sd-scripts defines them in its full fine-tuning scripts (options of what those scripts train that
difftune's full fine-tune does not), its scripts for other model families (Lumina, Anima,
HunyuanImage), its textual-inversion and ControlNet scripts, and, in ``NEWER_RELEASE``, releases
newer than the one difftune follows (tests/config/kohya_arguments.py names that commit). Each key is
known by name, so a file that has it is never met with "unknown key": at its off value (argparse's
default) it changes nothing and is accepted; any other value is refused, saying what the option
belongs to and what to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from library.config.unsupported import Unsupported, group
from library.models.families.registry import trained_lines

_FAMILIES = f"difftune trains {trained_lines()} models"


def _family(name: str, scripts: str) -> str:
    return f"it belongs to sd-scripts' {name} training ({scripts}); {_FAMILIES}"


_LUMINA = _family("Lumina Image 2.0", "lumina_train.py, lumina_train_network.py")
_ANIMA = _family("Anima", "anima_train.py, anima_train_network.py")
_HUNYUAN = _family("HunyuanImage 2.1", "hunyuan_image_train_network.py")
_ANIMA_OR_HUNYUAN = _family(
    "Anima and HunyuanImage", "anima_train*.py, hunyuan_image_train_network.py"
)
_TEXTUAL_INVERSION = (
    "it belongs to sd-scripts' textual-inversion training (train_textual_inversion*.py), which "
    "difftune does not do; train a LoRA instead"
)
_CONTROL_NET = (
    "it belongs to sd-scripts' ControlNet / ControlNet-LLLite training, which difftune does not "
    "do"
)
_TEXT_ENCODER = (
    "difftune's full fine-tune trains the denoiser only; to train the text encoders too, train "
    "a LoRA (network_train_unet_only = false)"
)

def _refused(keys: str, reason: str, off: tuple = ()) -> dict[str, Unsupported]:
    return group(keys, reason, off, planned=False)


OTHER_TRAININGS: dict[str, Unsupported] = {
    **_refused("gemma2 gemma2_max_token_length system_prompt sample_batch_size", _LUMINA),
    **_refused("use_flash_attn use_sage_attn", _LUMINA, (False,)),
    **_refused(
        "cross_attn_lr llm_adapter_lr llm_adapter_path mlp_lr mod_lr qwen3 self_attn_lr", _ANIMA
    ),
    **_refused("qwen3_max_token_length t5_max_token_length", _ANIMA, (512,)),
    **_refused("unsloth_offload_checkpointing vae_disable_cache", _ANIMA, (False,)),
    **_refused("attn_mode vae_chunk_size", _ANIMA_OR_HUNYUAN),
    **_refused("byt5", _HUNYUAN),
    # split_attn, fp8_scaled and fp8_vl are musubi-tuner's options too (musubi_args)
    **_refused("text_encoder_cpu", _HUNYUAN, (False,)),
    **_refused("init_word token_string weights", _TEXTUAL_INVERSION),
    **_refused("num_vectors_per_token", _TEXTUAL_INVERSION, (1,)),
    **_refused("use_object_template use_style_template", _TEXTUAL_INVERSION, (False,)),
    **_refused("cond_emb_dim controlnet_model_name_or_path", _CONTROL_NET),
    **_refused("control_net_lr", _CONTROL_NET, (0.0001,)),
}

# Options of sd-scripts' full fine-tuning scripts (sdxl_train.py, fine_tune.py, train_db.py,
# flux_train.py, sd3_train.py) that difftune's full fine-tune (train_mode = "unet") does not have.
FULL_FINE_TUNE: dict[str, Unsupported] = {
    **_refused("train_text_encoder", _TEXT_ENCODER, (False,)),
    # their rates only act with train_text_encoder, refused above when true
    **group(
        "learning_rate_te learning_rate_te1 learning_rate_te2 learning_rate_te3",
        "it only acts with train_text_encoder, which difftune does not do",
        ("",),
        ignored=True,
    ),
    "block_lr": Unsupported(
        "per-block learning rates of a full fine-tune are planned (LoRA has down_lr_weight, "
        "mid_lr_weight and up_lr_weight)"
    ),
    "blockwise_fused_optimizers": Unsupported("fused optimizer steps are planned", (False,)),
    "num_last_block_to_freeze": Unsupported("freezing the last blocks of a full fine-tune is planned"),
    "use_t5xxl_cache_only": Unsupported(
        "the text encoders never train in a full fine-tune here: use cache_text_encoder_outputs",
        (False,),
        planned=False,
    ),
    # flux_train.py turns them into blocks_to_swap = double + single / 2; its LoRA script never
    # reads them, and the kohya_ss GUI writes its "(deprecated)" sliders into LoRA exports too
    **group(
        "double_blocks_to_swap single_blocks_to_swap",
        "deprecated in sd-scripts, where only flux_train.py (the full fine-tune) reads them, as "
        "blocks_to_swap = double + single / 2, which saves memory and changes no result; write "
        "blocks_to_swap (difftune swaps blocks for LoRA training)",
        (0,),
        ignored=True,
    ),
    "skip_latents_validity_check": Unsupported(
        "deprecated in sd-scripts for skip_cache_check; difftune checks every cache entry "
        "against the image's content",
        (False,),
        planned=False,
    ),
    "use_safetensors": Unsupported(
        "difftune always saves .safetensors", (False, True), ignored=True
    ),
    "diffusers_xformers": Unsupported(
        "attention always runs through PyTorch's scaled-dot-product attention, whose "
        "memory-efficient kernel is xformers' algorithm (see xformers)",
        (False,),
        ignored=True,
    ),
    "mem_eff_save": Unsupported(
        "difftune's full-model saves always write the model piece by piece (a tensor, or a "
        "transformer block, at a time), so a save holds no second copy of the model in host "
        "memory: what mem_eff_save asks sd-scripts for",
        (False, True),
        ignored=True,
    ),
}


# The options of what only full fine-tuning scripts train or save (sd-scripts' above and
# train_db.py's, musubi-tuner's qwen_image_train.py / zimage_train.py; not their switches that
# change nothing, such as use_safetensors, nor what the kohya_ss GUI also writes into LoRA
# exports, such as stop_text_encoder_training): a file that sets one and names no
# network_module (which every LoRA script needs) was written for a full fine-tune. The
# kohya_ss GUI's DreamBooth and fine-tune exports always carry learning_rate_te (SDXL:
# learning_rate_te1 and learning_rate_te2).
FULL_FINE_TUNE_MARKS = (
    *(k for k in FULL_FINE_TUNE if k.startswith(("learning_rate_te", "train_text_encoder"))),
    "block_lr",
    "blockwise_fused_optimizers",
    "num_last_block_to_freeze",
    "use_t5xxl_cache_only",
    "mem_eff_save",
    "block_swap_optimizer_patch_params",
)


def full_fine_tune_problem(values: Mapping[str, object]) -> str | None:
    """Why a file with these flat ``values`` cannot train as it stands: it sets options of a
    full fine-tuning script (FULL_FINE_TUNE_MARKS, to other than false) but neither
    network_module nor train_mode, so difftune's default, a LoRA, would train instead of the
    whole model. None when it can."""
    if "network_module" in values or "train_mode" in values:
        return None
    # a switch written false (train_text_encoder = false) asks for nothing of the sort
    marks = [k for k, value in values.items() if k in FULL_FINE_TUNE_MARKS and value is not False]
    if not marks:
        return None
    return (
        f"{', '.join(marks)}: options of a full fine-tuning script (sd-scripts' sdxl_train.py, "
        "flux_train.py, sd3_train.py, train_db.py, fine_tune.py, which the kohya_ss GUI's "
        "DreamBooth and fine-tune tabs run, or musubi-tuner's full fine-tunes), and no "
        'network_module: set train_mode = "unet" to fine-tune the whole denoiser (the text '
        "encoders stay frozen), or network_module to train a LoRA"
    )


@dataclass(frozen=True)
class NewerKey:
    """An option sd-scripts added after the commit difftune follows."""

    release: str  # the first sd-scripts release known to have it
    source: str  # where the name comes from
    what: str  # what it does there
    off: tuple = (False,)  # its values that change nothing
    # it only acts together with another option (refused itself when on): any value is
    # dropped, with a note when it is not off
    ignored: bool = False


_GUI_V26 = (
    "written by the kohya_ss GUI v26 (bmaltais/kohya_ss), which runs sd-scripts v0.11.1; "
    "sd-scripts defines it in library/args.py"
)

# Keep separate from the inventory: these names are not in the sd-scripts commit that
# tests/config/kohya_arguments.py was generated from, and the inventory tool cannot see them.
NEWER_RELEASE: dict[str, NewerKey] = {
    "train_inpainting": NewerKey(
        "v0.10.4",
        "kohya-ss/sd-scripts pull requests #2309 and #2318 (docs/inpainting_training.md)",
        "inpainting training of SD 1.x and SDXL: the UNet gets 9 input channels, the noisy "
        "latents plus a random mask and the masked image's latents",
    ),
    "show_timesteps": NewerKey(
        "v0.11.1",
        _GUI_V26 + " (add_dit_training_arguments)",
        "shows the run's timestep distribution on the console or as an image, then exits "
        "without training",
        ("",),
    ),
    "show_timesteps_resolution": NewerKey(
        "v0.11.1",
        _GUI_V26 + " (add_dit_training_arguments)",
        "the image size of show_timesteps' picture; it only acts with show_timesteps",
        ignored=True,
    ),
    "compile": NewerKey(
        "v0.11.1",
        _GUI_V26 + " (its Anima and DiT options)",
        "torch.compile of the transformer's blocks",
    ),
    **{
        key: NewerKey(
            "v0.11.1",
            _GUI_V26 + " (its Anima and DiT options)",
            f"a torch.compile setting ({key}); it only acts with compile",
            ignored=True,
        )
        for key in (
            "compile_backend",
            "compile_mode",
            "compile_dynamic",
            "compile_fullgraph",
            "compile_cache_size_limit",
        )
    },
    "qwen_image_vae_2d": NewerKey(
        "v0.11.1",
        _GUI_V26 + " (its Anima options)",
        "Anima: run the Qwen-Image VAE in a 2-D form, a speed option of sd-scripts' Anima "
        "training (which difftune does not do); difftune runs that VAE as diffusers does",
        ignored=True,
    ),
}

NEWER_UNSUPPORTED: dict[str, Unsupported] = {
    key: Unsupported(
        f"sd-scripts {entry.release} added it: {entry.what}"
        + ("" if entry.ignored else "; difftune follows an earlier sd-scripts and does not do this"),
        entry.off,
        planned=False,
        ignored=entry.ignored,
    )
    for key, entry in NEWER_RELEASE.items()
}
