"""Keys that front ends write into kohya-style args files and sd-scripts never reads.

GUIs and helper scripts around kohya-ss sd-scripts save their own settings into the args TOML
they hand to ``train_network.py --config_file``. sd-scripts builds an argparse namespace straight
from that file, so such keys are silently carried along and never used. difftune loads these
files with one warning line listing the keys it ignored, instead of stopping at an unknown key.

A key is listed only when a released tool writes it into the args file it passes to sd-scripts
and neither ``train_network.py`` nor ``sdxl_train_network.py`` defines it. Arguments of other
sd-scripts scripts or model families (``stop_text_encoder_training`` of train_db.py, Flux.1/SD3
keys such as ``t5xxl`` or ``blocks_to_swap``) are not listed here: they are real options.
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
}
