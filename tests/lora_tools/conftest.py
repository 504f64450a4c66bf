"""Fixtures for the LoRA toolbox tests: small synthetic kohya files (tests/lora_tools/
lora_files.py) and a command runner."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.lora_tools.lora_files import BASE_METADATA, BASE_MODULES, module_tensors, save


@pytest.fixture
def make_lora(tmp_path):
    """``make_lora(name, modules=BASE_MODULES, metadata=BASE_METADATA, seed=0)`` -> path of a
    kohya LoRA/LoCon file in tmp_path."""

    def make(name="input.safetensors", modules=None, metadata=None, seed=0, scale=1.0):
        tensors = {}
        for index, (module, spec) in enumerate((modules or BASE_MODULES).items()):
            tensors.update(module_tensors(module, spec, seed * 100 + index, scale))
        return save(tmp_path / name, tensors, dict(BASE_METADATA if metadata is None else metadata))

    return make


@pytest.fixture
def lora_file(make_lora):
    return make_lora()


def read(path):
    """(tensors, metadata) of a safetensors file, read directly."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata() or {})  # noqa: SIM118


@pytest.fixture
def read_file():
    return read


def module_deltas(path) -> dict[str, torch.Tensor]:
    """name -> the module's weight change ``alpha / r * up @ down`` as [out, in*kh*kw] float64,
    computed with tests.networks.lora_merge.lora_delta."""
    from tests.networks.lora_merge import lora_delta

    tensors, _ = read(path)
    names = sorted({k.split(".", 1)[0] for k in tensors if k.endswith(".lora_down.weight")})
    deltas = {}
    for name in names:
        down = tensors[f"{name}.lora_down.weight"].double()
        up = tensors[f"{name}.lora_up.weight"].double()
        rank = down.shape[0]
        alpha = tensors[f"{name}.alpha"].item() if f"{name}.alpha" in tensors else rank
        shape = (up.shape[0], down.shape[1], *down.shape[2:])
        delta = lora_delta(down, up, alpha / rank, torch.Size(shape))
        deltas[name] = delta.reshape(shape[0], -1).double()
    return deltas


@pytest.fixture
def deltas():
    return module_deltas


@pytest.fixture
def tool(monkeypatch, capsys):
    """``tool(*argv)`` -> (exit code, stdout, stderr) of ``lora_tool.py argv`` through
    library.lora_tools.cli.main. Commands whose module does not exist yet are left out of the
    parser (others are written in parallel), so the tests do not depend on them."""
    from library.lora_tools import cli

    present = {
        command: module
        for command, module in cli.COMMANDS.items()
        if importlib.util.find_spec(f"library.lora_tools.{module}") is not None
    }
    monkeypatch.setattr(cli, "COMMANDS", present)

    def run(*argv):
        capsys.readouterr()
        code = cli.main([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def one_error_line(err: str) -> str:
    """The single ``error:`` line a refused command printed (asserts there is exactly one)."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def error_line():
    return one_error_line
