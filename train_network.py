"""Train a LoRA or the full UNet of a Stable Diffusion model from one TOML file.

    accelerate launch train_network.py --config configs/quickstart.toml [--key value ...]

See README.md and docs/config.md. Every option of the config can be given on the command line
(``--learning_rate 1e-4``); the command line wins over the file.
"""

from library.cli import exit_process, main

if __name__ == "__main__":
    exit_process(main())
