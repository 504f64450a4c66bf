"""Text files the user names are read with a bound: a device, a pipe or a huge file is refused
at once, naming the file, instead of being read for ever."""

from __future__ import annotations

import os

import pytest

from library import user_files
from library.config.loader import load_config
from library.config.sampling_schema import SamplingSection
from library.errors import ConfigError
from library.sampling.prompts import load_prompts
from library.user_files import read_user_text


def _error(call) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_a_device_is_refused_by_name(tmp_path):
    assert _error(lambda: read_user_text("/dev/zero", "config file")) == (
        "config file /dev/zero is not a regular file (a device, pipe or socket); give the path "
        "of a text file"
    )
    assert "config file /dev/zero is not a regular file" in _error(lambda: load_config("/dev/zero"))
    prompts = tmp_path / "prompts.txt"
    prompts.symlink_to("/dev/zero")  # a link to a device is read as the device
    assert f"sample_prompts file {prompts} is not a regular file" in _error(
        lambda: load_prompts(prompts, SamplingSection(), 0)
    )


def test_a_dataset_config_that_is_a_pipe_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "dataset.toml"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer for ever
    config = tmp_path / "a.toml"
    config.write_text(f'pretrained_model_name_or_path = "m"\ndataset_config = "{fifo}"\n')
    assert f"dataset_config file {fifo} is not a regular file" in _error(
        lambda: load_config(str(config))
    )


def test_a_huge_file_is_refused_and_a_text_file_reads_as_text(tmp_path, monkeypatch):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"\xef\xbb\xbfa cat\r\na dog\rend\n")
    assert read_user_text(path, "sample_prompts file") == "a cat\na dog\nend\n"
    monkeypatch.setattr(user_files, "MAX_TEXT_BYTES", 8)
    assert _error(lambda: read_user_text(path, "sample_prompts file")).startswith(
        f"sample_prompts file {path} is larger than "
    )
