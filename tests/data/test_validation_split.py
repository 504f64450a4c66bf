"""validation_indices: a keyed, order-independent hold-out of training images."""

import random

import pytest

from library.data.schedule import stable_seed
from library.data.validation_split import validation_indices

KEYS = [f"{i % 3}/img_{i:03d}.png" for i in range(40)]


def test_partition_is_disjoint_and_complete_with_the_lowest_hashes_held_out():
    held = validation_indices(KEYS, 0.2, seed=7)
    train = set(range(len(KEYS))) - held
    assert len(held) == 8 and held <= set(range(len(KEYS)))
    assert held.isdisjoint(train) and held | train == set(range(len(KEYS)))
    # the documented rule, written out: the 8 keys with the smallest hashes
    hashes = {key: stable_seed(7, "validation", key) for key in KEYS}
    cut = sorted(hashes.values())[7]
    assert {KEYS[i] for i in held} == {key for key, h in hashes.items() if h <= cut}


def test_choice_does_not_depend_on_the_order_of_the_keys():
    held = {KEYS[i] for i in validation_indices(KEYS, 0.25, seed=3)}
    for shuffle_seed in range(3):
        shuffled = KEYS[:]
        random.Random(shuffle_seed).shuffle(shuffled)
        assert shuffled != KEYS
        assert {shuffled[i] for i in validation_indices(shuffled, 0.25, seed=3)} == held


def test_identical_across_calls_and_different_for_other_seeds():
    first = validation_indices(KEYS, 0.25, seed=5)
    assert validation_indices(KEYS, 0.25, seed=5) == first
    others = {validation_indices(KEYS, 0.25, seed=s) for s in (6, 7, 8)}
    assert first not in others and len(others) == 3


@pytest.mark.parametrize(
    "n,fraction,expected",
    [
        (10, 0.0, 0),  # nothing asked
        (0, 0.5, 0),  # no images
        (1, 0.5, 0),  # the only image must train
        (2, 0.01, 1),  # rounds to 0, but fraction > 0 holds one out
        (2, 0.9, 1),  # rounds to 2, but training keeps one
        (10, 0.1, 1),
        (10, 0.25, 3),  # 2.5 rounds half up
        (3, 0.5, 2),  # 1.5 rounds half up
        (100, 0.125, 13),
        (10, 0.94, 9),
        (10, 0.999, 9),
    ],
)
def test_count(n, fraction, expected):
    keys = [f"0/{i}.png" for i in range(n)]
    assert len(validation_indices(keys, fraction, seed=1)) == expected


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_fraction_outside_range_is_refused(fraction):
    with pytest.raises(ValueError, match="outside"):
        validation_indices(KEYS, fraction, seed=0)


def test_repeated_keys_are_refused():
    with pytest.raises(ValueError, match="0/a.png"):
        validation_indices(["0/a.png", "0/b.png", "0/a.png"], 0.5, seed=0)


def test_adding_an_image_moves_at_most_the_boundary():
    base = KEYS[:30]
    for fraction in (0.1, 0.25, 0.5):
        before = {base[i] for i in validation_indices(base, fraction, seed=2)}
        for extra in range(10):
            grown = [*base, f"1/new_{extra}.png"]
            after = {grown[i] for i in validation_indices(grown, fraction, seed=2)}
            old_after = after - {grown[-1]}
            # at most one old image crosses the cut
            assert len(before ^ old_after) <= 1, (fraction, extra)
