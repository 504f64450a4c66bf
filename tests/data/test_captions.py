from __future__ import annotations

import itertools
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from library.data.captions import CaptionOptions, process_caption, warmup_tag_count

TAGS = [f"t{i}" for i in range(8)]


def run(caption, positions=range(1), epoch=0, seed=7, step=0, max_steps=1, **options):
    """process_caption for each position, with the given options."""
    opts = CaptionOptions(**options)
    return [
        process_caption(
            caption,
            opts,
            seed=seed,
            epoch=epoch,
            position=p,
            global_step=step,
            max_train_steps=max_steps,
        )
        for p in positions
    ]


@pytest.mark.parametrize(
    "caption",
    ["a photo of sks dog", "  a,,b , {x|y} ||| c;;;d  ", "", "x\ny", "ünï, cödé"],
)
def test_defaults_are_identity(caption):
    assert run(caption, positions=range(5), epoch=3, step=9) == [caption] * 5


def test_same_key_same_result_other_keys_differ():
    caption = ", ".join(TAGS)
    options = dict(shuffle_caption=True, caption_tag_dropout_rate=0.2)
    random.seed(1)
    first = run(caption, positions=range(40), **options)
    random.seed(2)  # global RNG state must not matter
    assert run(caption, positions=range(40), **options) == first
    assert len(set(first)) > 30
    by_epoch = [run(caption, positions=[5], epoch=e, **options)[0] for e in range(40)]
    assert len(set(by_epoch)) > 30
    by_seed = [run(caption, positions=[5], seed=s, **options)[0] for s in range(40)]
    assert len(set(by_seed)) > 30


def test_shuffle_keeps_tags_and_fixed_head():
    caption = " , ".join(TAGS) + ",, "
    results = run(caption, positions=range(100), shuffle_caption=True, keep_tokens=2)
    for result in results:
        tags = result.split(", ")
        assert sorted(tags) == sorted(TAGS)
        assert tags[:2] == TAGS[:2]
    assert len({r.split(", ")[2] for r in results}) == len(TAGS) - 2


def test_shuffle_reaches_every_order():
    results = run("a, b, c", positions=range(200), shuffle_caption=True)
    expected = {", ".join(p) for p in itertools.permutations("abc")}
    assert set(results) == expected


def test_keep_tokens_separator_head_and_tail():
    caption = "sks dog, solo ||| red, blue , green ||| best, hq"
    ordered = run(caption, keep_tokens_separator="|||", keep_tokens=5)
    assert ordered == ["sks dog, solo, red, blue, green, best, hq"]
    for result in run(
        caption, positions=range(50), shuffle_caption=True, keep_tokens_separator="|||"
    ):
        tags = result.split(", ")
        assert tags[:2] == ["sks dog", "solo"]
        assert tags[-2:] == ["best", "hq"]
        assert sorted(tags[2:5]) == ["blue", "green", "red"]


def test_keep_tokens_separator_once_and_absent_and_repeated():
    once = run("a ||| b, c", positions=range(30), shuffle_caption=True, keep_tokens_separator="|||")
    assert set(once) == {"a, b, c", "a, c, b"}
    # Absent marker: keep_tokens decides the head.
    absent = run(
        "a, b, c",
        positions=range(30),
        shuffle_caption=True,
        keep_tokens=1,
        keep_tokens_separator="|||",
    )
    assert set(absent) == {"a, b, c", "a, c, b"}
    # A third marker separates tail tags; it never reaches the output.
    assert run("a ||| b ||| c ||| d", keep_tokens_separator="|||") == ["a, b, c, d"]


def test_tag_dropout_rate_and_fixed_tags_kept():
    flexible = [f"f{i}" for i in range(10)]
    caption = "head ||| " + ", ".join(flexible) + " ||| tail"
    results = run(
        caption, positions=range(400), keep_tokens_separator="|||", caption_tag_dropout_rate=0.3
    )
    dropped = 0
    for result in results:
        tags = result.split(", ")
        assert tags[0] == "head" and tags[-1] == "tail"
        kept = tags[1:-1]
        assert kept == [t for t in flexible if t in kept]  # order kept without shuffle
        dropped += len(flexible) - len(kept)
    assert 0.25 < dropped / (400 * len(flexible)) < 0.35
    assert run(caption, keep_tokens_separator="|||", caption_tag_dropout_rate=1.0) == ["head, tail"]


def test_dropout_every_n_epochs():
    dropped = [
        e
        for e in range(12)
        if run("a, b", epoch=e, caption_dropout_every_n_epochs=3, caption_prefix="p ") == [""]
    ]
    assert dropped == [2, 5, 8, 11]
    assert run("a, b", epoch=1, caption_dropout_every_n_epochs=3, caption_prefix="p ") == ["p a, b"]


def test_caption_dropout_rate_frequency():
    results = run("a, b", positions=range(2000), caption_dropout_rate=0.25, caption_suffix="!")
    assert set(results) == {"", "a, b!"}
    assert 0.21 < results.count("") / 2000 < 0.29
    assert run("a", positions=range(50), caption_dropout_rate=1.0) == [""] * 50


def expected_warmup(n, minimum, step, span):
    """Hand-written token warmup count (independent of the module)."""
    if span == 0 or step >= span:
        return n
    return min(n, minimum + (n - minimum) * step // span)


@pytest.mark.parametrize("step", [0, 1, 3, 4, 7, 8, 20])
@pytest.mark.parametrize("form", ["steps", "ratio"])
def test_token_warmup_counts(step, form):
    flexible = [f"f{i}" for i in range(10)]
    caption = "head, " + ", ".join(flexible)
    warmup = {"token_warmup_step": 8} if form == "steps" else {"token_warmup_step": 0.5}
    result = run(caption, step=step, max_steps=16, keep_tokens=1, token_warmup_min=2, **warmup)
    k = expected_warmup(10, 2, step, 8)
    assert result == [", ".join(["head"] + flexible[:k])]
    assert {0: 2, 4: 6, 7: 9, 8: 10}.get(step, k) == k  # spot values of the formula


def test_warmup_count_clipped_when_minimum_exceeds_tags():
    options = CaptionOptions(token_warmup_step=10, token_warmup_min=5)
    assert warmup_tag_count(3, options, 0, 1) == 3
    assert warmup_tag_count(0, options, 4, 1) == 0


def test_wildcards_choose_listed_alternatives_independently():
    results = run("{red|green|blue} dog, {a|b}", positions=range(300), enable_wildcard=True)
    pairs = Counter((r.split(" dog, ")[0], r.split(" dog, ")[1]) for r in results)
    assert set(pairs) == set(itertools.product(["red", "green", "blue"], ["a", "b"]))
    assert set(run("{solo} x {} {a|}", positions=range(40), enable_wildcard=True)) == {
        "solo x {} a",
        "solo x {} ",
    }


def test_wildcards_then_tag_operations():
    results = run("{a, b|c}, d", positions=range(60), enable_wildcard=True, shuffle_caption=True)
    assert set(results) == {
        "a, b, d",
        "a, d, b",
        "b, a, d",
        "b, d, a",
        "d, a, b",
        "d, b, a",
        "c, d",
        "d, c",
    }


def test_multi_line_choice():
    caption = "first\n\n  second, {x|y}  \r\nthird\n"
    results = run(caption, positions=range(200), enable_wildcard=True)
    assert set(results) == {"first", "second, x", "second, y", "third"}


def test_secondary_separator():
    caption = "a, black;;;hair , ;;; , c;;; "
    assert run(caption, secondary_separator=";;;") == ["a, black, hair, c"]
    results = run(
        "a, b, black;;;hair", positions=range(60), shuffle_caption=True, secondary_separator=";;;"
    )
    for result in results:
        assert "black, hair" in result
        assert sorted(result.split(", ")) == ["a", "b", "black", "hair"]
    assert len(set(results)) == 6
    dropped = run(
        "black;;;hair", positions=range(40), caption_tag_dropout_rate=0.5, secondary_separator=";;;"
    )
    assert set(dropped) == {"", "black, hair"}


def test_prefix_and_suffix_added_as_written():
    assert run("a,b", caption_prefix="sks dog, ", caption_suffix=" END") == ["sks dog, a,b END"]
    results = run(
        "a, b, c",
        positions=range(30),
        shuffle_caption=True,
        caption_prefix="P, ",
        caption_suffix=", S",
    )
    for result in results:
        assert result.startswith("P, ") and result.endswith(", S")
        assert sorted(result[3:-3].split(", ")) == ["a", "b", "c"]


def test_other_separator():
    results = run("a. b.c", positions=range(30), shuffle_caption=True, caption_separator=".")
    assert {tuple(sorted(r.split(". "))) for r in results} == {("a", "b", "c")}
    assert run("a  b", keep_tokens=1, caption_separator=" ") == ["a b"]


@pytest.mark.parametrize(
    "options",
    [
        {"caption_dropout_rate": 1.5},
        {"caption_tag_dropout_rate": -0.1},
        {"caption_dropout_rate": float("nan")},
        {"keep_tokens": -1},
        {"token_warmup_min": -1},
        {"token_warmup_step": -2},
        {"caption_dropout_every_n_epochs": -1},
        {"caption_separator": ""},
        {"secondary_separator": ","},
        {"keep_tokens_separator": ","},
    ],
)
def test_invalid_options(options):
    with pytest.raises(ValueError, match=next(iter(options))):
        CaptionOptions(**options)


def test_ratio_warmup_needs_max_train_steps():
    with pytest.raises(ValueError, match="max_train_steps"):
        run("a, b", token_warmup_step=0.5, max_steps=0)


def test_from_subset_and_is_random():
    subset = SimpleNamespace(shuffle_caption=True, keep_tokens=2, caption_separator=None, other=1)
    options = CaptionOptions.from_subset(subset)
    assert options == CaptionOptions(shuffle_caption=True, keep_tokens=2)
    assert options.is_random
    assert not CaptionOptions(keep_tokens=3, caption_prefix="x", secondary_separator=";").is_random
    for random_option in [
        {"enable_wildcard": True},
        {"caption_dropout_rate": 0.1},
        {"caption_dropout_every_n_epochs": 2},
        {"caption_tag_dropout_rate": 0.1},
        {"token_warmup_step": 5},
    ]:
        assert CaptionOptions(**random_option).is_random
