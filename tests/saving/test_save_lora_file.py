"""kohya LoRA files: dtypes, metadata, kohya's hashes, and clear errors for unusable files."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from library.errors import CheckpointError
from library.saving.lora_file import read_lora_file, save_lora_file

NAME = "lora_unet_mid_block_attentions_0_proj_in"


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return {
        f"{NAME}.lora_down.weight": torch.randn(4, 32, 1, 1, generator=gen),
        f"{NAME}.lora_up.weight": torch.randn(32, 4, 1, 1, generator=gen),
        f"{NAME}.alpha": torch.tensor(0.1),
    }


def test_weights_take_the_save_dtype_alpha_stays_float32(tmp_path):
    path = tmp_path / "a.safetensors"
    save_lora_file(path, _tensors(), {"ss_network_dim": "4"}, torch.float16)
    tensors, metadata = read_lora_file(path)
    source = _tensors()
    for key in (f"{NAME}.lora_down.weight", f"{NAME}.lora_up.weight"):
        assert tensors[key].dtype == torch.float16
        assert torch.equal(tensors[key], source[key].half())
    assert tensors[f"{NAME}.alpha"].dtype == torch.float32
    assert tensors[f"{NAME}.alpha"].item() == torch.tensor(0.1).item()
    assert metadata["ss_network_dim"] == "4"


def _header(path):
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def test_kohya_model_hash_is_sha256_of_tensor_data(tmp_path):
    path = tmp_path / "h.safetensors"
    save_lora_file(path, _tensors(), {"ss_network_dim": "4"}, torch.float32)
    header, data = _header(path)
    assert header["__metadata__"]["sshs_model_hash"] == hashlib.sha256(data).hexdigest()
    assert len(header["__metadata__"]["sshs_legacy_hash"]) == 8


def test_no_metadata_writes_no_header_metadata(tmp_path):
    path = tmp_path / "n.safetensors"
    save_lora_file(path, _tensors(), None, torch.float32)
    header, _ = _header(path)
    assert "__metadata__" not in header
    assert read_lora_file(path)[1] == {}


def test_metadata_values_must_be_strings(tmp_path):
    with pytest.raises(TypeError, match="ss_steps"):
        save_lora_file(tmp_path / "x.safetensors", _tensors(), {"ss_steps": 3}, torch.float32)
    assert list(tmp_path.iterdir()) == []


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found: .*nope.safetensors"):
        read_lora_file(tmp_path / "nope.safetensors")


def test_truncated_file(tmp_path):
    path = tmp_path / "t.safetensors"
    save_lora_file(path, _tensors(), {}, torch.float32)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 100])
    with pytest.raises(CheckpointError, match="t.safetensors: not a readable safetensors"):
        read_lora_file(path)


def test_not_safetensors(tmp_path):
    path = tmp_path / "g.safetensors"
    path.write_text("this is not a tensor file, just words")
    with pytest.raises(CheckpointError, match="g.safetensors: not a readable safetensors"):
        read_lora_file(path)


@pytest.mark.parametrize(
    "name, zip_format", [("lora.pt", True), ("old.ckpt", False), ("x.safetensors", True)]
)
def test_a_pickled_lora_is_named_a_pickle(tmp_path, name, zip_format):
    """torch.save's zip and legacy formats (also under a .safetensors name): not read, and said
    so with the way out, instead of "truncated or corrupt"."""
    path = tmp_path / name
    torch.save(_tensors(), path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(CheckpointError) as caught:
        read_lora_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: a pickled PyTorch file") and "corrupt" not in message
    assert "convert it to .safetensors" in message


def test_a_safetensors_header_that_starts_like_a_pickle_is_read(tmp_path):
    """A header length whose first byte is 0x80 (a pickle's first byte) is still safetensors."""
    path = tmp_path / "a.safetensors"
    for pad in range(300):
        save_file(_tensors(), str(path), metadata={"pad": "x" * pad})
        if path.read_bytes()[:2] == b"\x80\x02":
            break
    assert path.read_bytes()[:2] == b"\x80\x02"
    tensors, _ = read_lora_file(path)
    assert sorted(tensors) == sorted(_tensors())
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 10])  # damaged: still not called a pickle
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        read_lora_file(path)


def test_safetensors_without_lora_keys(tmp_path):
    path = tmp_path / "unet.safetensors"
    save_file({"conv_in.weight": torch.zeros(2, 2)}, str(path))
    with pytest.raises(CheckpointError, match="unet.safetensors: not a LoRA file"):
        read_lora_file(path)


def test_peft_format_is_named(tmp_path):
    path = tmp_path / "peft.safetensors"
    save_file({"unet.conv_in.lora_A.weight": torch.zeros(2, 2)}, str(path))
    with pytest.raises(CheckpointError, match="diffusers/PEFT-format"):
        read_lora_file(path)
