"""difftune: fine-tune Stable Diffusion models (LoRA or full UNet) from one TOML file."""

__version__ = "0.1.0"
