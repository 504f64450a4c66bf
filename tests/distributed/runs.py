"""Running training the way users do: torchrun with 2 CPU processes over gloo, or in-process.

Each run writes its weights to ``out`` and, under a Probe, its measurements to ``out/probe``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.distributed.probe import Probe
from tests.integration.harness import tensors, train

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "tests" / "distributed" / "launch.py"
TRAIN_NETWORK = REPO / "train_network.py"
TIMEOUT = 300  # seconds for one launch; a hung collective must not hang CI


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env(
    probe: Path | None,
    hook: bool = False,
    grads: bool = False,
    interrupt: tuple[int, int] | None = None,
) -> dict:
    """The environment of a CPU launch: gloo via accelerate, one thread per process, offline."""
    env = dict(os.environ)
    env.update(
        ACCELERATE_USE_CPU="true",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    for key in list(env):
        if key.startswith("DIFFTUNE_PROBE"):
            del env[key]
    if probe is not None:
        env["DIFFTUNE_PROBE"] = str(probe)
    if hook:
        env["DIFFTUNE_PROBE_HOOK"] = "1"
    if grads:
        env["DIFFTUNE_PROBE_GRADS"] = "1"
    if interrupt is not None:
        env["DIFFTUNE_PROBE_INTERRUPT"] = f"{interrupt[0]}:{interrupt[1]}"
    return env


@dataclass
class Run:
    """A finished run: exit code, output folder, console log and probe measurements."""

    returncode: int
    out: Path
    log: str
    probe: Path | None = None
    records: dict[int, dict] | None = None  # in-process runs keep the record in memory

    def weights(self, name: str = "run.safetensors") -> dict[str, torch.Tensor]:
        path = self.out / name
        assert path.exists(), f"{path} was not written; log tail:\n{self.log[-3000:]}"
        return tensors(path)

    def rank(self, rank: int) -> dict:
        """The probe record of process ``rank``."""
        if self.records is not None:
            return self.records[rank]
        return json.loads((self.probe / f"rank{rank}.json").read_text(encoding="utf-8"))

    def grads(self, rank: int) -> dict:
        return torch.load(self.probe / f"rank{rank}.pt", weights_only=True)

    def check(self) -> Run:
        assert self.returncode == 0, f"exit code {self.returncode}; log tail:\n{self.log[-4000:]}"
        return self


def _outputs(out: Path) -> list[str]:
    return ["--output_dir", str(out), "--logging_dir", str(out / "logs")]


def torchrun(
    cfg: Path,
    *args: str,
    out: Path,
    nproc: int = 2,
    script: Path = LAUNCH,
    hook: bool = False,
    grads: bool = False,
    interrupt: tuple[int, int] | None = None,
) -> Run:
    """``torchrun --nproc_per_node nproc script --config cfg args...``, writing to ``out``."""
    probe = out / "probe" if script == LAUNCH else None
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(script), "--config", str(cfg), *_outputs(out), *args,
    ]  # fmt: skip
    done = subprocess.run(
        command,
        env=launch_env(probe, hook, grads, interrupt),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return _logged(Run(done.returncode, out, done.stdout + done.stderr, probe))


def torchrun_script(script: Path, *args: str, out: Path, nproc: int = 2) -> Run:
    """``torchrun --nproc_per_node nproc script args...`` (a test script, not a training run)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *args,
    ]  # fmt: skip
    done = subprocess.run(
        command, env=launch_env(None), cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT
    )
    return _logged(Run(done.returncode, out, done.stdout + done.stderr))


def _logged(run: Run, name: str = "console.log") -> Run:
    """Keep the whole console output beside the run's files, for reading after a failure."""
    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / name).write_text(run.log, encoding="utf-8")
    return run


def torchrun_two_nodes(cfg: Path, *args: str, out: Path) -> tuple[Run, Run]:
    """Two torchrun launches, one per "node" on localhost, meeting at one static rendezvous."""
    port = free_port()
    probe = out / "probe"
    procs = []
    for node in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
            "--rdzv_backend", "static",
            "--master_addr", "127.0.0.1", "--master_port", str(port),
            str(LAUNCH), "--config", str(cfg), *_outputs(out), *args,
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                command,
                env=launch_env(probe),
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    runs = []
    try:
        for proc in procs:
            log, _ = proc.communicate(timeout=TIMEOUT)
            runs.append(
                _logged(Run(proc.returncode, out, log, probe), f"console-node{len(runs)}.log")
            )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return runs[0], runs[1]


def in_process(cfg: Path, *args: str, out: Path) -> Run:
    """A single-process run inside pytest (no launcher start-up cost), under a Probe.

    One thread, like each launched process: the launches run beside it on the same cores, and
    idle threads spinning for work would only slow everything down.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Probe() as probe:
            code = train(cfg, *_outputs(out), *args)
    finally:
        torch.set_num_threads(threads)
    return Run(code, out, "", records={0: probe.record})


def scalars(logging_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a tracker tag, from every TensorBoard event file under ``logging_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(logging_dir.rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event files under {logging_dir}"
    values = []
    for file in files:
        acc = EventAccumulator(str(file), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values += [(e.step, e.value) for e in acc.Scalars(tag)]
    return sorted(values)
