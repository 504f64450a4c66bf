"""A memory estimate whose forward pass fails on the run's shapes is an error, not a note: the
first step would fail the same way, so the dry run must not plan the run as if all was well
(ignore_memory_estimate = true goes on without an estimate). An operation the meta device
cannot run is the estimate's own limit and only noted."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from library.errors import ConfigError
from library.training import memory_check
from library.training.memory_check import check_peak_memory
from tests.integration.harness import make_images, train, write_config

SHAPES = "shape '[2, 16, 4, 2, 4, 2]' is invalid for input of size 2592"
META = "Could not run 'aten::_local_scalar_dense' with arguments from the 'Meta' backend."


def _failing(monkeypatch, exc: Exception) -> None:
    def estimate(*_args, **_kwargs):
        raise exc

    monkeypatch.setattr(memory_check, "estimate_peak_memory", estimate)


def _check(ignore: bool):
    config = SimpleNamespace(training=SimpleNamespace(ignore_memory_estimate=ignore))
    accelerator = SimpleNamespace(device=torch.device("cpu"), num_processes=1)
    return check_peak_memory(config, None, None, accelerator, False)


@pytest.mark.parametrize("error", [RuntimeError(SHAPES), ValueError("latent height 9 is odd")])
def test_a_forward_pass_that_fails_on_the_shapes_stops_the_run(monkeypatch, error):
    _failing(monkeypatch, error)
    with pytest.raises(ConfigError) as refused:
        _check(ignore=False)
    message = str(refused.value)
    assert f"the model cannot run this run's shapes ({error})" in message
    assert "ignore_memory_estimate = true" in message and "\n" not in message
    check = _check(ignore=True)
    assert check.estimate is None and check.report() is None
    assert check.line == (
        f"  memory: not estimated (the forward pass on this run's shapes failed: {error}; going "
        "on as ignore_memory_estimate = true asks)"
    )


@pytest.mark.parametrize("error", [NotImplementedError(META), RuntimeError("meta tensors")])
def test_what_the_meta_device_cannot_run_is_only_noted(monkeypatch, error):
    _failing(monkeypatch, error)
    check = _check(ignore=False)
    assert check.estimate is None
    assert (
        check.line == f"  memory: not estimated (this model cannot run on the meta device: {error})"
    )


@pytest.mark.integration
def test_the_dry_run_refuses_instead_of_planning(tmp_path, tiny_model_dir, monkeypatch, capsys):
    images = make_images(tmp_path / "imgs", 2)
    config = write_config(tmp_path / "c.toml", tiny_model_dir, images, tmp_path / "out")
    _failing(monkeypatch, RuntimeError(SHAPES))
    assert train(config, "--dry_run") == 2
    err = capsys.readouterr().err
    assert re.findall(r"(?m)^error: .*", err) == [
        f"error: the model cannot run this run's shapes ({SHAPES}): the memory estimate's forward "
        "pass on them failed, and training would stop at its first step; check the sizes it is "
        "given (resolution, bucket_reso_steps, control_resolution), or set "
        "ignore_memory_estimate = true to go on without an estimate"
    ]
    assert train(config, "--dry_run", "--json") == 2
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "refused" and SHAPES in document["error"]
    assert train(config, "--dry_run", "--ignore_memory_estimate") == 0
    assert "memory: not estimated (the forward pass on this run's shapes failed" in (
        capsys.readouterr().out
    )
