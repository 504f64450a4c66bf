"""The LoRA toolbox behind lora_tool.py: one module per command (see COMMANDS in cli.py)."""
