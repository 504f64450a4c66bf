"""The README's quickstart command, as a user types it, produces a LoRA file that loads."""

import os
import shutil
import subprocess
from pathlib import Path

import torch

from library.saving.lora_file import read_lora_file

REPO = Path(__file__).resolve().parents[2]


def test_quickstart_command(tmp_path):
    out = tmp_path / "output"
    accelerate = shutil.which("accelerate")
    assert accelerate, "accelerate's launcher is installed with requirements.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [accelerate, "launch", "train_network.py", "--config", "configs/quickstart.toml", "--output_dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "total optimizer steps" in result.stdout
    tensors, metadata = read_lora_file(out / "quickstart.safetensors")
    assert metadata["ss_network_module"] == "networks.lora"
    assert metadata["modelspec.architecture"] == "stable-diffusion-v1/lora"
    ups = [t for k, t in tensors.items() if k.endswith("lora_up.weight")]
    assert ups and all(torch.isfinite(t).all() for t in ups)
    assert any(t.abs().sum() > 0 for t in ups), "training moved the adapters"
    assert (out / "quickstart-000001.safetensors").exists()  # save_every_n_epochs = 1
