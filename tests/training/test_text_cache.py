"""TextEncoderCache and text_identity against fresh encodings, call counts and files on disk."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors import safe_open

from library.data.content_hash import tensor_digest
from library.models.conditioning import TextConditioning, encode_text
from library.training.text_cache import TextEncoderCache, text_identity

CAPTIONS = ["a red circle", "shape", "a red circle", "blue square on white"]




class Recorder:
    """``encode`` for the cache: encode_text with the model, recording each call's captions."""

    def __init__(self, parts, clip_skip=None, dtype=None):
        self.parts, self.clip_skip, self.dtype = parts, clip_skip, dtype
        self.calls: list[list[str]] = []

    def __call__(self, captions: list[str]) -> TextConditioning:
        self.calls.append(list(captions))
        return fresh(self.parts, captions, self.clip_skip, self.dtype)


@torch.no_grad()
def fresh(parts, captions, clip_skip=None, dtype=None) -> TextConditioning:
    p = parts
    out = encode_text(p.family, p.tokenizers, p.text_encoders, captions, "cpu", clip_skip)
    if dtype is not None:
        out = TextConditioning(out.hidden.to(dtype), None if out.pooled is None else out.pooled)
    return out


def identity(parts, clip_skip=None, encoders=None) -> str:
    encoders = parts.text_encoders if encoders is None else encoders
    return text_identity(parts.family, encoders, clip_skip, None, torch.float32)


def assert_rows_match(got: TextConditioning, expected: TextConditioning, atol=0.0) -> None:
    torch.testing.assert_close(got.hidden, expected.hidden, rtol=0, atol=atol)
    assert (got.pooled is None) == (expected.pooled is None)
    if got.pooled is not None:
        torch.testing.assert_close(got.pooled, expected.pooled, rtol=0, atol=atol)


def test_memory_second_get_encodes_nothing(sd1):
    encode = Recorder(sd1)
    cache = TextEncoderCache(identity(sd1), to_disk=False)
    first = cache.get(CAPTIONS, None, encode)
    # One call with the distinct missing captions, in first-seen order.
    assert encode.calls == [["a red circle", "shape", "blue square on white"]]
    assert cache.encoded == 3
    second = cache.get(list(reversed(CAPTIONS)), None, encode)
    assert len(encode.calls) == 1 and cache.encoded == 3
    # Rows follow the captions' order; cached rows equal the ones first returned exactly.
    assert torch.equal(second.hidden, first.hidden.flip(0))
    assert second.pooled is None
    # Exactly the rows of a fresh encoding of the batch the cache encoded...
    distinct = cache.get(encode.calls[0], None, encode)
    assert_rows_match(distinct, fresh(sd1, encode.calls[0]), atol=0.0)
    # ...and those of a fresh encoding of the same captions (other batch composition).
    assert_rows_match(second, fresh(sd1, list(reversed(CAPTIONS))), atol=1e-6)


def test_only_the_new_captions_are_encoded(sd1):
    encode = Recorder(sd1)
    cache = TextEncoderCache(identity(sd1), to_disk=False)
    cache.get(["shape"], None, encode)
    got = cache.get(["shape", "new one", "new one"], None, encode)
    assert encode.calls == [["shape"], ["new one"]]
    assert_rows_match(got, fresh(sd1, ["shape", "new one", "new one"]), atol=1e-6)


def test_identity_changes_with_what_changes_the_output(sd1):
    base = identity(sd1)
    assert base == identity(sd1)
    assert base != identity(sd1, clip_skip=2)
    assert base != text_identity(sd1.family, sd1.text_encoders, None, 150, torch.float32)
    assert base != text_identity(sd1.family, sd1.text_encoders, None, None, torch.bfloat16)
    perturbed = copy.deepcopy(sd1.text_encoder)
    with torch.no_grad():
        perturbed.get_input_embeddings().weight[5, 3] += 1e-3
    assert base != identity(sd1, encoders=(perturbed,))
    loaded = text_identity(sd1.family, sd1.text_encoders, None, None, torch.float32)
    assert loaded == base  # deterministic over calls


def test_another_identity_misses_on_disk(sd1, tmp_path):
    roots = [tmp_path] * len(CAPTIONS)
    TextEncoderCache(identity(sd1), True).get(CAPTIONS, roots, Recorder(sd1))
    encode = Recorder(sd1, clip_skip=2)
    other = TextEncoderCache(identity(sd1, clip_skip=2), to_disk=True)
    got = other.get(CAPTIONS, roots, encode)
    assert encode.calls == [["a red circle", "shape", "blue square on white"]]
    assert_rows_match(got, fresh(sd1, CAPTIONS, clip_skip=2), atol=1e-6)


def test_disk_files_are_read_by_a_new_cache(sd1, tmp_path):
    # "a red circle" appears under both folders and gets a file in each.
    roots = [tmp_path / "set_a", tmp_path / "set_b", tmp_path / "set_b", tmp_path / "set_a"]
    first = TextEncoderCache(identity(sd1), to_disk=True)
    written = first.get(CAPTIONS, roots, Recorder(sd1))
    files = sorted(
        p.relative_to(tmp_path).parent.as_posix() for p in tmp_path.rglob("*.safetensors")
    )
    assert files == ["set_a/text", "set_a/text", "set_b/text", "set_b/text"]
    with safe_open(str(first.path(roots[1], "shape")), framework="pt") as f:
        checksum = tensor_digest({"hidden": f.get_tensor("hidden")})
        assert f.metadata() == {"caption": "shape", "identity": identity(sd1), "checksum": checksum}
        assert set(f.keys()) == {"hidden"}
    encode = Recorder(sd1)
    second = TextEncoderCache(identity(sd1), to_disk=True)
    got = second.get(CAPTIONS, roots, encode)
    assert encode.calls == [] and second.encoded == 0
    assert torch.equal(got.hidden, written.hidden)
    assert got.hidden.device.type == "cpu" and got.hidden.dtype == torch.float32


def test_corrupt_or_foreign_files_are_re_encoded(sd1, tmp_path):
    roots = [tmp_path] * len(CAPTIONS)
    first = TextEncoderCache(identity(sd1), to_disk=True)
    first.get(CAPTIONS, roots, Recorder(sd1))
    truncated = first.path(tmp_path, "shape")
    truncated.write_bytes(truncated.read_bytes()[:50])
    # Another caption's file in "blue square on white"'s place: metadata does not match.
    foreign = first.path(tmp_path, "blue square on white")
    foreign.write_bytes(first.path(tmp_path, "a red circle").read_bytes())
    encode = Recorder(sd1)
    second = TextEncoderCache(identity(sd1), to_disk=True)
    got = second.get(CAPTIONS, roots, encode)
    assert encode.calls == [["shape", "blue square on white"]]
    assert_rows_match(got, fresh(sd1, CAPTIONS), atol=1e-6)
    # The bad files were replaced by good ones: a third cache encodes nothing.
    third_encode = Recorder(sd1)
    TextEncoderCache(identity(sd1), to_disk=True).get(CAPTIONS, roots, third_encode)
    assert third_encode.calls == []


def test_sdxl_pooled_rows_in_memory_and_on_disk(sdxl, tmp_path):
    roots = [tmp_path] * len(CAPTIONS)
    cache = TextEncoderCache(identity(sdxl), to_disk=True)
    got = cache.get(CAPTIONS, roots, Recorder(sdxl))
    expected = fresh(sdxl, CAPTIONS)
    assert got.pooled is not None and got.pooled.shape == (4, 24)
    assert_rows_match(got, expected, atol=1e-6)
    with safe_open(str(cache.path(tmp_path, "shape")), framework="pt") as f:
        assert set(f.keys()) == {"hidden", "pooled"}
        assert f.get_tensor("hidden").shape == (77, 32 + 48)
    encode = Recorder(sdxl)
    again = TextEncoderCache(identity(sdxl), to_disk=True).get(CAPTIONS, roots, encode)
    assert encode.calls == []
    assert torch.equal(again.hidden, got.hidden) and torch.equal(again.pooled, got.pooled)


def test_rows_keep_the_dtype_encode_gives(sd1):
    encode = Recorder(sd1, dtype=torch.bfloat16)
    cache = TextEncoderCache(identity(sd1), to_disk=False)
    first = cache.get(["shape"], None, encode)
    both = cache.get(["shape", "other"], None, encode)
    assert first.hidden.dtype == both.hidden.dtype == torch.bfloat16
    assert torch.equal(both.hidden[0], first.hidden[0])


def test_prefill_shards_across_ranks(sd1, tmp_path):
    captions = [f"caption {i}" for i in range(7)] + ["caption 3"]
    roots = [tmp_path] * len(captions)
    seen = []
    distinct = list(dict.fromkeys(captions))
    for rank in (1, 0):  # rank 1 first: rank 0 must not be thrown off by its files
        encode = Recorder(sd1)
        cache = TextEncoderCache(identity(sd1), to_disk=True)
        done = cache.prefill(captions, roots, encode, batch_size=2, rank=rank, world_size=2)
        batch_sizes = [len(call) for call in encode.calls]
        assert all(size <= 2 for size in batch_sizes) and sum(batch_sizes) == done
        mine = [c for call in encode.calls for c in call]
        assert mine == distinct[rank::2]
        seen += mine
    # Every distinct caption encoded exactly once across the two ranks.
    assert sorted(seen) == sorted(set(captions))
    encode = Recorder(sd1)
    cache = TextEncoderCache(identity(sd1), to_disk=True)
    assert cache.prefill(captions, roots, encode, batch_size=4) == 0
    got = cache.get(captions, roots, encode)
    assert encode.calls == []
    assert_rows_match(got, fresh(sd1, captions), atol=1e-6)


def test_prefill_without_disk_encodes_everything_on_each_rank(sd1):
    encode = Recorder(sd1)
    cache = TextEncoderCache(identity(sd1), to_disk=False)
    done = cache.prefill(CAPTIONS, None, encode, 2, rank=1, world_size=2, progress=True)
    assert done == 3 and [len(c) for c in encode.calls] == [2, 1]
    cache.get(CAPTIONS, None, encode)
    assert len(encode.calls) == 2
    with pytest.raises(ValueError, match="batch_size"):
        cache.prefill(CAPTIONS, None, encode, 0)
