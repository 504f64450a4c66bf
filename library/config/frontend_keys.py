"""Keys that front ends write into kohya-style args files and sd-scripts never reads.

GUIs and helper scripts around kohya-ss sd-scripts save their own settings into the args TOML
they hand to ``train_network.py --config_file`` (or ``flux_train_network.py``,
``sd3_train_network.py``). sd-scripts builds an argparse namespace straight from that file, so
such keys are silently carried along and never used. difftune loads these files with one
warning line listing the keys it ignored, instead of stopping at an unknown key.

A key is listed only when a released tool writes it into the args file it passes to sd-scripts
and no sd-scripts training script defines it (every ``*train*.py`` and ``fine_tune.py`` with
the ``library/`` parsers, sd-scripts 48d368fa of February 2026). An argument of any sd-scripts
script is a real option even where the script a file is given to ignores it, so these
front-end writes are not listed: the kohya_ss GUI's split block-swap counts
``double_blocks_to_swap`` / ``single_blocks_to_swap`` (its "(deprecated)" Flux.1 sliders,
written into LoRA exports as well; flux_train.py reads them as ``blocks_to_swap = double +
single // 2``), ``mem_eff_save`` (flux_train.py), and lora-scripts' top-level ``train_t5xxl``
(sd3_train.py). Nor are names difftune reads itself: lora-scripts' ``sample_width``,
``sample_height``, ``sample_steps`` and ``sample_seed`` are difftune's sampling defaults, and
the kohya_ss GUI v25's top-level ``loraplus_*_ratio`` keys are difftune's LoRA+ keys.
Dataset TOMLs (``--dataset_config``) are checked by sd-scripts and have no such keys.

``FRONTEND_ONLY_KEYS`` maps each key to the tool(s) that write it, as shown in the warning.
"""

from __future__ import annotations

FRONTEND_ONLY_KEYS: dict[str, str] = {
    # bmaltais/kohya_ss, kohya_gui/lora_gui.py (config_toml_data -> config_lora-*.toml).
    # Always written since v24.0.0: the GUI's epoch field (it computes max_train_steps from it)
    # and its noise-offset mode ("Original" or "Multires").
    "epoch": "kohya_ss GUI",
    "noise_offset_type": "kohya_ss GUI",
    # v24.0.0-v24.0.5 only: later renamed to network_weights and log_with.
    "lora_network_weights": "kohya_ss GUI",
    "use_wandb": "kohya_ss GUI",
    # v25.0.0-v25.2.2, when ticked; no sd-scripts training script has --lowvram.
    "lowvram": "kohya_ss GUI",
    # derrian-distro LoRA_Easy_Training_Scripts: saving options of the UI that its backend
    # (utils/validation.py) copies into runtime_store/config.toml.
    "easy_name": "LoRA_Easy_Training_Scripts",
    "save_toml": "LoRA_Easy_Training_Scripts",
    "save_toml_location": "LoRA_Easy_Training_Scripts",
    "tag_occurrence": "LoRA_Easy_Training_Scripts",
    "tag_file_location": "LoRA_Easy_Training_Scripts",
    # Akegarasu lora-scripts: config/default.toml, passed by train_by_toml.sh/.ps1; the name of
    # its shell scripts' variable for lr_scheduler_num_cycles.
    "lr_restart_cycles": "lora-scripts (Akegarasu)",
    # Akegarasu lora-scripts (SD-Trainer) web UI, main since e0f5194 (2025-06-11), every model
    # type (sd/sdxl/flux/sd3 LoRA): with "预览图 Prompt 文件" (a sample prompts file) set,
    # mikazuki/app/api.py create_toml_file only adds sample_prompts and leaves the UI's preview
    # fields in config/autosave/<time>.toml (without a file it pops them into a prompt line).
    "prompt_file": "lora-scripts (Akegarasu)",
    "positive_prompts": "lora-scripts (Akegarasu)",
    "negative_prompts": "lora-scripts (Akegarasu)",
    "randomly_choice_prompt": "lora-scripts (Akegarasu)",
    "sample_cfg": "lora-scripts (Akegarasu)",
}
