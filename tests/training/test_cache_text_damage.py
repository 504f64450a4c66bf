"""Text-encoder cache files whose metadata was kept but whose tensors were changed: each damage
is found, exactly that caption is encoded again with one warning naming the file, and the row
equals a fresh encode."""

from __future__ import annotations

import logging

import pytest
import torch

from library.errors import DataError
from library.models.conditioning import TextConditioning
from library.training.text_cache import TextEncoderCache
from tests.cache_tamper import (
    drop_checksum,
    garbage_tensor_bytes,
    put_nan,
    rewrite,
    scale_by_two,
)
from tests.training.test_text_cache import CAPTIONS, Recorder, assert_rows_match, fresh, identity

DAMAGES = {
    "hidden scaled by 2": (lambda f: rewrite(f, scale_by_two("hidden")), "checksum mismatch"),
    "random bytes": (garbage_tensor_bytes, "checksum mismatch"),
    "a NaN in hidden": (lambda f: rewrite(f, put_nan("hidden")), "checksum mismatch"),
    "a NaN, checksum forged": (lambda f: rewrite(f, put_nan("hidden", True)), "non-finite"),
    "no checksum": (lambda f: rewrite(f, drop_checksum), "no checksum"),
}


def damage_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "was damaged" in r.getMessage()]


def reencodes_only(parts, tmp_path, caplog, tamper, reason, caption="shape") -> None:
    """Write every caption's file, tamper with `caption`'s, and check a new cache re-encodes
    exactly it, warns once naming the file, returns fresh rows and leaves a good file."""
    roots = [tmp_path] * len(CAPTIONS)
    first = TextEncoderCache(identity(parts), to_disk=True)
    first.get(CAPTIONS, roots, Recorder(parts))
    file = first.path(tmp_path, caption)
    tamper(file)

    encode = Recorder(parts)
    second = TextEncoderCache(identity(parts), to_disk=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        got = second.get(CAPTIONS, roots, encode)
    assert encode.calls == [[caption]]
    [warning] = damage_warnings(caplog)
    assert warning.startswith(f"text cache entry {file} was damaged ({reason}")
    assert warning.endswith("; re-encoded")
    assert_rows_match(got, fresh(parts, CAPTIONS), atol=1e-6)
    row = CAPTIONS.index(caption)
    alone = fresh(parts, [caption])  # how it was encoded again: in a batch of its own
    torch.testing.assert_close(got.hidden[row], alone.hidden[0], rtol=0, atol=0)
    if alone.pooled is not None:
        torch.testing.assert_close(got.pooled[row], alone.pooled[0], rtol=0, atol=0)

    third_encode = Recorder(parts)
    caplog.clear()
    TextEncoderCache(identity(parts), to_disk=True).get(CAPTIONS, roots, third_encode)
    assert third_encode.calls == [] and not damage_warnings(caplog)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_file_is_reencoded_alone(sd1, tmp_path, caplog, damage):
    tamper, reason = DAMAGES[damage]
    reencodes_only(sd1, tmp_path, caplog, tamper, reason)


def test_damaged_pooled_is_found_too(sdxl, tmp_path, caplog):
    tamper = lambda f: rewrite(f, scale_by_two("pooled"))  # noqa: E731
    reencodes_only(sdxl, tmp_path, caplog, tamper, "checksum mismatch", caption="a red circle")


def test_prefill_finds_damage_before_training(sd1, tmp_path, caplog):
    roots = [tmp_path] * len(CAPTIONS)
    first = TextEncoderCache(identity(sd1), to_disk=True)
    first.prefill(CAPTIONS, roots, Recorder(sd1), batch_size=4)
    rewrite(first.path(tmp_path, "blue square on white"), scale_by_two("hidden"))
    encode = Recorder(sd1)
    cache = TextEncoderCache(identity(sd1), to_disk=True)
    with caplog.at_level(logging.WARNING):
        assert cache.prefill(CAPTIONS, roots, encode, batch_size=4) == 1
    assert encode.calls == [["blue square on white"]] and len(damage_warnings(caplog)) == 1
    cache.get(CAPTIONS, roots, encode)  # training then encodes nothing
    assert len(encode.calls) == 1


def test_untouched_files_are_hits_without_warnings(sd1, tmp_path, caplog):
    roots = [tmp_path] * len(CAPTIONS)
    written = TextEncoderCache(identity(sd1), True).get(CAPTIONS, roots, Recorder(sd1))
    encode = Recorder(sd1)
    caplog.clear()
    got = TextEncoderCache(identity(sd1), True).get(CAPTIONS, roots, encode)
    assert encode.calls == [] and not damage_warnings(caplog)
    assert torch.equal(got.hidden, written.hidden)


def test_encoder_nan_is_refused_naming_the_caption(sd1, tmp_path):
    def nan_for_shape(captions: list[str]) -> TextConditioning:
        out = fresh(sd1, captions)
        out.hidden[captions.index("shape"), 2, 1] = float("nan")
        return out

    cache = TextEncoderCache(identity(sd1), to_disk=True)
    with pytest.raises(DataError, match="NaN or Inf outputs for the caption 'shape'"):
        cache.get(CAPTIONS, [tmp_path] * len(CAPTIONS), nan_for_shape)
    assert not list(tmp_path.glob("text/*.safetensors"))
