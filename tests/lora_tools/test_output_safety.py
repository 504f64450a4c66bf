"""A toolbox command never writes over one of its inputs (--overwrite or not, however the path
is written) and never suggests --overwrite for it; it writes under the output name's lock; a
command killed mid-write leaves nothing that the next write of that output does not remove,
and SIGTERM removes its own temporary file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lora_tools.model_helpers import TrainedLora, error_lines, load, model_dir, run_tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sd1(tmp_path_factory, kit_folders):
    """A copy of the tiny SD 1.x model of its own (a refusal that failed would write into it)
    and a LoRA of it."""
    root = tmp_path_factory.mktemp("safety")
    base = shutil.copytree(model_dir("sd1", kit_folders), root / "sd15")
    lora = TrainedLora(load(base), rank=2, alpha=2.0, seed=21).save(root / "lora.safetensors")
    return {"root": root, "model": base, "lora": lora}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _refused(capsys, *argv) -> str:
    assert run_tool(*argv) == 2, argv
    (line,) = error_lines(capsys.readouterr().err)
    assert "--overwrite" not in line, line  # replacing an input is never the fix
    return line


def test_merge_never_writes_over_the_model_or_its_parts(sd1, tmp_path, capsys):
    model, lora = sd1["model"], sd1["lora"]
    before = _snapshot(model)
    vae = model / "vae" / "diffusion_pytorch_model.safetensors"
    twin = tmp_path / "twin.safetensors"
    os.link(vae, twin)  # --output is the --vae file under another name
    cases = [
        (["--output_dir", model], f"--output_dir {model} is --model {model}"),
        (["--output_dir", model / "unet"], "lies inside --model"),
        (["--output", model / "merged.safetensors"], "lies inside --model"),
        (["--output", twin, "--vae", vae], f"is a hard link of --vae {vae}"),
    ]
    for options, expected in cases:
        for extra in ([], ["--overwrite"]):
            line = _refused(capsys, "merge", "--model", model, "--loras", lora, *options, *extra)
            assert expected in line and "inputs are never replaced" in line, line
    assert _snapshot(model) == before


@pytest.mark.parametrize("command", ["merge-loras", "resize", "convert", "extract", "metadata"])
def test_every_command_that_writes_refuses_its_input_as_output(
    command, sd1, tmp_path, capsys, make_lora
):
    model = sd1["model"]
    lora = make_lora("in.safetensors") if command in ("merge-loras", "resize") else sd1["lora"]
    (tmp_path / "sub").mkdir()
    link = tmp_path / "sub" / "link.safetensors"
    link.symlink_to(lora)
    weights = model / "unet" / "diffusion_pytorch_model.safetensors"
    argv, output, expected = {
        "merge-loras": (
            ["--inputs", make_lora("other.safetensors", seed=3), lora],
            link,
            "is --inputs",
        ),
        "resize": (
            ["--input", lora, "--rank", 2],
            tmp_path / "sub" / ".." / lora.name,
            "is --input",
        ),
        "convert": (["--input", lora, "--model", model, "--to", "diffusers"], link, "is --input"),
        "extract": (
            ["--base", model, "--tuned", model, "--rank", 2],
            weights,
            "lies inside --base",
        ),
        "metadata": (["--input", lora, "--set", "a=1"], link, "use --in_place"),
    }[command]
    before = {path: path.read_bytes() for path in (lora, weights)}
    line = _refused(capsys, command, *argv, "--output", output)
    assert expected in line, line
    assert {path: path.read_bytes() for path in before} == before


_SLOW_WRITE = """
import sys, time
import library.saving.atomic as atomic
write_file = atomic.atomic_write_file
def slow(path, write):
    def then_wait(tmp):
        write(tmp)
        print("written", flush=True)  # whole, not yet renamed into place
        time.sleep(300)
    return write_file(path, then_wait)
atomic.atomic_write_file = slow
from library.lora_tools.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _merge_until_written(sd1, out: Path) -> subprocess.Popen:
    argv = ["merge", "--model", sd1["model"], "--loras", sd1["lora"], "--output", out]
    process = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITE, *map(str, argv)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for line in process.stdout:  # the command prints what it merged first
        if line.strip() == "written":
            return process
    process.wait()
    raise AssertionError(f"the merge ended before writing: {process.stderr.read()}")


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.subprocess
def test_a_killed_merge_leaves_nothing_the_next_one_does_not_remove(sd1, tmp_path):
    out = tmp_path / "merged.safetensors"
    process = _merge_until_written(sd1, out)
    process.kill()  # kill -9: nothing of the command runs any more
    process.wait()
    left = _temporaries(tmp_path)
    assert (
        len(left) == 1 and left[0].startswith(".merged.safetensors.") and left[0].endswith(".tmp")
    )
    assert (tmp_path / left[0]).stat().st_size > 100_000  # the whole merged model, hidden
    assert not out.exists()
    assert run_tool("merge", "--model", sd1["model"], "--loras", sd1["lora"], "--output", out) == 0
    assert out.is_file() and _temporaries(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged.safetensors"]  # no lock left


@pytest.mark.subprocess
def test_sigterm_stops_a_merge_and_removes_its_temporary_file(sd1, tmp_path):
    out = tmp_path / "merged.safetensors"
    process = _merge_until_written(sd1, out)
    assert _temporaries(tmp_path)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in process.stderr.read()
    assert list(tmp_path.iterdir()) == []  # no output, no temporary, no lock


_HOLD = """
import sys, time
from library.saving.run_lock import RunLock
RunLock(sys.argv[1], sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(300)
"""


@pytest.mark.subprocess
def test_an_output_name_a_run_is_writing_is_refused(sd1, tmp_path, capsys):
    """A training run (or another command) holding output name "merged" in this folder."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path), "merged"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        out = tmp_path / "merged-step00000002.safetensors"  # a file that run may write
        for argv in (
            ["merge", "--model", sd1["model"], "--loras", sd1["lora"], "--output", out],
            ["resize", "--input", sd1["lora"], "--rank", 1, "--output", out],
        ):
            assert run_tool(*argv) == 2
            (line,) = error_lines(capsys.readouterr().err)
            assert f"pid {holder.pid}" in line and "merged.lock" in line, line
            assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    started = time.time()
    assert run_tool("resize", "--input", sd1["lora"], "--rank", 1, "--output", out) == 0
    assert time.time() - started < 60


@pytest.mark.subprocess
def test_a_second_command_writing_the_same_output_is_refused_while_the_first_works(
    sd1, tmp_path, capsys, monkeypatch
):
    """Two resizes to one output: the second (another process) starts while the first is
    still computing, and is refused at once; the first then writes its file."""
    from library.lora_tools import resize

    out = tmp_path / "resized.safetensors"
    argv = ["resize", "--input", sd1["lora"], "--rank", "1", "--output", str(out)]
    second = []
    real = resize.svd.svd_of_factors

    def and_a_second_command(*args, **kwargs):
        if not second:
            second.append(
                subprocess.run(
                    [sys.executable, "lora_tool.py", *argv],
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )  # fmt: skip
            )
        return real(*args, **kwargs)

    monkeypatch.setattr(resize.svd, "svd_of_factors", and_a_second_command)
    assert run_tool(*argv) == 0
    (refused,) = second
    assert refused.returncode == 2, refused.stderr
    (line,) = error_lines(refused.stderr)
    assert f"--output {out}" in line and "resized.lock" in line and "--output" in line, line
    assert out.is_file() and not (tmp_path / "resized.lock").exists()


@pytest.mark.subprocess
def test_a_reader_that_stops_early_ends_the_command_quietly(sd1):
    """``lora_tool.py metadata --input FILE | head -0``: no traceback, SIGPIPE's exit status."""
    process = subprocess.Popen(
        [sys.executable, "lora_tool.py", "metadata", "--input", str(sd1["lora"])],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    process.stdout.close()  # before the command prints anything (it imports torch first)
    err = process.stderr.read()
    assert process.wait(timeout=300) == 128 + 13, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
