"""The GPU check (bench/gpu_check.py) in its tiny mode, on the CPU as CI runs it: every check
trains, and its figures are what its run and the step timer recorded; checks that need CUDA are
skipped there, a run the memory estimate refuses is reported as refused, and GPUs are found in
the peak-throughput table by the names CUDA gives them."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from bench import gpu_check
from bench.train_speed import BenchError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.subprocess
@pytest.mark.integration
def test_the_tiny_checks_train_and_report(tmp_path):
    report = tmp_path / "report.json"
    command = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--tiny", "--device", "cpu",
               "--steps", "3", "--warmup", "1", "--model_cache", str(tmp_path / "models"),
               "--json", str(report)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    written = json.loads(report.read_text())
    assert written["checks"] == printed
    assert written["machine"]["device"] == "cpu" and written["peak_tflops"] is None
    assert [r["check"] for r in printed] == list(gpu_check.TINY_CHECKS)
    for record in printed:
        batch = gpu_check.TINY_CHECKS[record["check"]].case.keys["train_batch_size"]
        assert record["status"] == "ok", record
        assert record["images_per_second"] == pytest.approx(
            batch / record["seconds_per_step"], rel=1e-2
        )
        assert record["achieved_flops_per_second"] == pytest.approx(
            record["step_flops"] / record["seconds_per_step"], rel=1e-6
        )
        assert record["step_flops"] > 0 and record["mfu"] is None  # no peak known for a CPU
        # the process holds its tensors and more; the estimate is of the process's size
        assert record["peak_process_bytes"] > record["peak_tensor_bytes"] > 0
        assert 0.5 < record["estimate_ratio"] < 2.0
        assert record["last_loss"] is not None
        assert gpu_check.line(record).startswith(f"{record['check']} (")


def _args(tmp_path, device="cpu") -> Namespace:
    return Namespace(device=device, steps=4, warmup=2, model_cache=tmp_path)


def test_checks_that_need_cuda_are_skipped_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "launch", lambda *a, **k: pytest.fail("nothing may run"))
    record = gpu_check.run_check("sd15-fp16", gpu_check.CHECKS["sd15-fp16"], _args(tmp_path),
                                 tmp_path / "run", None)  # fmt: skip
    assert (record["status"], record["reason"]) == ("skipped", "needs CUDA")
    assert gpu_check.line(record) == (
        "sd15-fp16 (fp16 with the loss scaler, AdamW8bit): skipped: needs CUDA"
    )


def test_a_run_the_estimate_refuses_is_reported_as_refused(tmp_path, monkeypatch):
    refusal = ("error: estimated peak memory 41.2 GiB exceeds the 23.6 GiB of cuda:0; lower "
               "train_batch_size or resolution, or set ignore_memory_estimate = true")  # fmt: skip

    def refused(*args, **kwargs):
        raise BenchError(f"train_network.py exited with 2:\nloading\n{refusal}")

    monkeypatch.setattr(gpu_check, "launch", refused)
    monkeypatch.setattr(gpu_check, "write_case_config", lambda *a: tmp_path / "c.toml")
    check = gpu_check.CHECKS["flux-bf16"]
    record = gpu_check.run_check("flux-bf16", check, _args(tmp_path, "cuda"), tmp_path / "r", 989)
    assert (record["status"], record["reason"]) == ("refused", refusal)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA GeForce RTX 4090", 165.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L40", 181.0),
        ("Some Future GPU", None),
    ],
)
def test_peak_throughput_by_the_name_cuda_gives(name, tflops):
    assert gpu_check.peak_tflops(name) == tflops


def test_random_weights_are_drawn_in_the_stored_dtype_and_leave_the_default_alone():
    import torch

    from bench.random_models import _drawn

    layer = _drawn(lambda: torch.nn.Linear(8, 8), "cpu", torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.device.type == "cpu"
    assert layer.weight.std() > 0  # drawn, not left empty
    with pytest.raises(ValueError):
        _drawn(lambda: (_ for _ in ()).throw(ValueError("no model")), "cpu", torch.float16)
    assert torch.get_default_dtype() == torch.float32
