"""fsdp_text_encoder: text encoders sharded over 2 processes fill the text cache with the states
the whole encoders give, each process calling them as often as the other (every call is a
collective), and every process ends with every caption; then they encode the sample prompts as
the whole encoders do (tests/distributed/text_sharding_fill.py);
in a training run (the modes that set the word, such as Z-Image's sharded one), each process
holds half of each encoder while it fills the cache, and the weights trained on that cache are
the one process's (test_equivalence.py).
"""

import json

import numpy as np
import pytest
from PIL import Image

from tests.distributed.suite import FSDP_PROMPTS, MODES
from tests.distributed.text_sharding_fill import CAPTIONS, SAMPLE_TEXTS
from tests.integration.harness import tensors

TEXT_SHARDED = [name for name, mode in MODES.items() if mode.keys.get("fsdp_text_encoder")]
LAUNCHES = ["text-fsdp", *(f"eq-{mode}-2x2x1" for mode in TEXT_SHARDED)]
ATOL = 1e-6


def _result(runs):
    runs.get("text-fsdp").check()
    return runs.root / "text-fsdp"


def test_sharded_encoders_cache_the_whole_encoders_states(runs):
    out = _result(runs)
    whole = tensors(out / "whole.safetensors")
    assert len(whole) == len(CAPTIONS)
    for rank in (0, 1):
        for cache in ("memory", "disk"):
            cached = tensors(out / f"rank{rank}-{cache}.safetensors")
            assert sorted(cached) == sorted(whole)  # every caption on every process
            for index, states in whole.items():  # per caption, against one whole encoding
                assert (cached[index] - states).abs().max().item() <= ATOL, (rank, cache, index)


def test_sharded_encoders_encode_the_sample_prompts_as_the_whole_ones(runs):
    out = _result(runs)
    whole = tensors(out / "whole-samples.safetensors")
    assert sorted(whole) == [str(i) for i in range(len(SAMPLE_TEXTS))]
    for rank in (0, 1):  # every process holds every prompt's states
        states = tensors(out / f"rank{rank}-samples.safetensors")
        assert sorted(states) == sorted(whole)
        for index, want in whole.items():
            assert states[index].shape == want.shape == (2, *want.shape[1:])  # prompt, negative
            assert (states[index] - want).abs().max().item() <= ATOL, (rank, index)


def test_each_process_calls_the_sharded_encoders_as_often(runs):
    out = _result(runs)
    calls = [json.loads((out / f"rank{rank}.json").read_text(encoding="utf-8")) for rank in (0, 1)]
    for cache in ("memory", "disk"):
        counts = [len(record[cache]) for record in calls]
        assert counts[0] == counts[1] > 0, cache
        assert all(call["sharded"] for record in calls for call in record[cache])
    # memory: 5 distinct captions in batches of 2, shared 3 / 2: rank 1 pads its second call
    # with one caption, whose output no entry keeps (each rank encoded its share only)
    assert [c["captions"] for c in calls[0]["memory"]] == [2, 1]
    assert [c["captions"] for c in calls[1]["memory"]] == [2, 1]
    # samples: every process encodes each distinct prompt's texts, in prompt order
    for record in calls:
        assert [c["captions"] for c in record["samples"]] == [2, 2]
        assert all(c["sharded"] for c in record["samples"])
    # disk: the caption already on disk is read, not encoded: one call each, no pad
    assert [c["captions"] for c in calls[0]["disk"]] == [2]
    assert [c["captions"] for c in calls[1]["disk"]] == [2]


@pytest.mark.parametrize("mode", TEXT_SHARDED)
def test_a_training_run_holds_half_of_each_text_encoder_while_it_caches(runs, mode):
    run = runs.equivalence(mode, "2x2x1")
    assert "the text encoders sharded over them while they fill the text cache" in run.log
    for rank in (0, 1):
        encoders = run.rank(rank)["text_sharded"]
        assert encoders
        for held in encoders:
            assert held["dtensors"] == held["tensors"] > 0
            assert 0.45 < held["local_numel"] / held["numel"] < 0.55
    # one process has nothing to shard with: it fills the cache with the encoders whole
    assert runs.equivalence(mode, "1x4x1").rank(0)["text_sharded"] == []


@pytest.mark.parametrize("mode", TEXT_SHARDED)
def test_samples_from_the_sharded_fill_are_the_whole_encoders(runs, mode):
    """The sample prompts' states, encoded by the sharded copies during the fill, draw the
    images that one process drawing with the whole encoders draws."""
    assert MODES[mode].samples
    for layout, ahead in (("2x2x1", True), ("1x4x1", False)):  # one process: encoded per round
        run = runs.equivalence(mode, layout)
        for rank in range(int(layout[0])):
            assert run.rank(rank)["sample_rounds"] == [{"step": 0, "texts_ahead": ahead}]
    sharded, whole = ({p.name: _pixels(p) for p in runs.equivalence(mode, layout).out.glob(
        "sample/*_0[0-9]_*.png")} for layout in ("2x2x1", "1x4x1"))  # fmt: skip
    assert len(sharded) == FSDP_PROMPTS.count("\n") and sorted(sharded) == sorted(whole)
    for name, image in sharded.items():
        assert image.shape == whole[name].shape and np.abs(image - whole[name]).max() <= 1, name


def _pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), np.int16)
