"""The README's quickstart command, as a user types it, produces a LoRA file that loads.

The run is shared with tests/integration/test_learning_demo.py, which measures what it learned:
``run_quickstart`` runs it once per test session.
"""

import os
import shutil
import subprocess
from pathlib import Path

import torch

from library.saving.lora_file import read_lora_file

REPO = Path(__file__).resolve().parents[2]


def run_quickstart(tmp_path_factory) -> Path:
    """Run ``accelerate launch train_network.py --config configs/quickstart.toml`` once per test
    session into a temporary output folder, and return the folder (its stdout is kept there in
    ``stdout.txt``)."""
    out = tmp_path_factory.getbasetemp() / "quickstart-output"
    stdout = out / "stdout.txt"
    if stdout.exists():
        return out
    accelerate = shutil.which("accelerate")
    assert accelerate, "accelerate's launcher is installed with requirements.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [accelerate, "launch", "train_network.py", "--config", "configs/quickstart.toml", "--output_dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    stdout.write_text(result.stdout, encoding="utf-8")
    return out


def test_quickstart_command(tmp_path_factory):
    out = run_quickstart(tmp_path_factory)
    assert "total optimizer steps" in (out / "stdout.txt").read_text(encoding="utf-8")
    tensors, metadata = read_lora_file(out / "quickstart.safetensors")
    assert metadata["ss_network_module"] == "networks.lora"
    assert metadata["modelspec.architecture"] == "stable-diffusion-v1/lora"
    ups = [t for k, t in tensors.items() if k.endswith("lora_up.weight")]
    assert ups and all(torch.isfinite(t).all() for t in ups)
    assert any(t.abs().sum() > 0 for t in ups), "training moved the adapters"
    assert (out / "quickstart-000010.safetensors").exists()  # save_every_n_epochs = 10
    # sample_at_first and sample_every_n_epochs = 10: the grids the README shows
    grids = sorted(p.name for p in (out / "sample").glob("quickstart_*_grid.png"))
    assert grids == [f"quickstart_{step:06d}_grid.png" for step in (0, 400, 800)], grids
