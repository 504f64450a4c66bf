"""With several processes, prompt i is drawn on rank i % world and rank 0 writes the whole grid.

The ranks here are simulated in one process (a stand-in accelerator per rank, the gather done by
hand), which tests our split and assembly; accelerate's gather_object carries the images between
real processes.
"""

from __future__ import annotations

import contextlib

import numpy as np
from sampling_helpers import pixels, prompts_of_a_round

import library.sampling.generate as generate
from library.sampling.generate import sample_images


class RankOf2:
    """The accelerator attributes sample_images uses, for process ``rank`` of 2."""

    num_processes = 2
    trackers: list = []

    def __init__(self, rank: int):
        self.process_index = rank

    def autocast(self):
        return contextlib.nullcontext()

    def unwrap_model(self, module):
        return module


def test_prompts_are_split_by_rank_and_the_grid_has_them_all(components, tmp_path, monkeypatch):
    prompts = prompts_of_a_round()
    drawn, sent = {}, {}
    original = generate._generate

    def recording(pipe, comps, prompt, accelerator, *rest):
        rank = accelerator.process_index if accelerator else "alone"
        drawn.setdefault(rank, []).append(prompt.index)
        return original(pipe, comps, prompt, accelerator, *rest)

    def gather(accelerator, mine, world):  # rank 1 runs first; rank 0 receives its images
        assert world == 2
        sent[accelerator.process_index] = mine
        return mine if accelerator.process_index else sent[1] + mine

    monkeypatch.setattr(generate, "_generate", recording)
    monkeypatch.setattr(generate, "_gather", gather)
    one = sample_images(components, prompts, step=4, output_dir=tmp_path / "r1", output_name="run",
                        accelerator=RankOf2(1))  # fmt: skip
    zero = sample_images(components, prompts, step=4, output_dir=tmp_path / "r0", output_name="run",
                         accelerator=RankOf2(0))  # fmt: skip
    assert drawn == {1: [1], 0: [0, 2]}  # prompt i on rank i % 2
    assert one.grid is None and [p.name for p in one.images] == [p.name for p in zero.images]
    assert sorted(p.name for p in (tmp_path / "r1" / "sample").iterdir()) == [one.images[1].name]
    assert sorted(p.name for p in (tmp_path / "r0" / "sample").iterdir()) == sorted(
        [zero.images[0].name, zero.images[2].name, "run_000004_grid.png"]
    )

    # The same round in one process gives the same images and the same grid.
    monkeypatch.setattr(generate, "_gather", lambda accelerator, mine, world: mine)
    single = sample_images(
        components, prompts, step=4, output_dir=tmp_path / "s", output_name="run"
    )
    assert (pixels(zero.grid) == pixels(single.grid)).all()
    for split, alone in [(one.images[1], single.images[1]), (zero.images[2], single.images[2])]:
        assert np.array_equal(pixels(split), pixels(alone))
