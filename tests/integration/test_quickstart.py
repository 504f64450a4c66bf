"""The README's quickstart command, as a user types it, produces a LoRA file that loads.

The run is shared with tests/integration/test_learning_demo.py, which measures what it learned:
the ``quickstart_output`` fixture (tests/conftest.py) runs it once per test session.
"""

import os
import shutil
import subprocess
from pathlib import Path

import torch

from library.saving.lora_file import read_lora_file

REPO = Path(__file__).resolve().parents[2]


def _output(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "quickstart-output"


def start_quickstart(tmp_path_factory) -> subprocess.Popen:
    """Start ``accelerate launch train_network.py --config configs/quickstart.toml`` into the
    session's quickstart folder, in the background, with one thread: the tests go on beside it
    (tests/conftest.py starts it when the session begins)."""
    accelerate = shutil.which("accelerate")
    assert accelerate, "accelerate's launcher is installed with requirements.txt"
    out = _output(tmp_path_factory)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # files, not pipes: nobody reads a pipe while the tests go on, and a full one would block
    with open(out / "stdout.part", "w") as stdout, open(out / "stderr.txt", "w") as stderr:
        return subprocess.Popen(
            [accelerate, "launch", "train_network.py", "--config", "configs/quickstart.toml", "--output_dir", str(out)],
            cwd=REPO, env=env, stdout=stdout, stderr=stderr,
        )  # fmt: skip


def finish_quickstart(proc: subprocess.Popen, tmp_path_factory) -> Path:
    """Wait for the quickstart run ``proc``; its output folder, with its stdout kept in
    ``stdout.txt``."""
    out = _output(tmp_path_factory)
    code = proc.wait(timeout=900)
    assert code == 0, (out / "stderr.txt").read_text(encoding="utf-8")[-3000:]
    (out / "stdout.part").rename(out / "stdout.txt")
    return out


def test_quickstart_command(quickstart_output):
    out = quickstart_output
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
