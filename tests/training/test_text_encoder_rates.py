"""text_encoder_lr as kohya reads it: a number for every encoder, a list per encoder in order
(a shorter one repeats its last rate), and rates beyond the model's encoders unused, as
sd-scripts leaves them (the kohya_ss GUI writes two rates for SD 1.5's single encoder)."""

import logging

import pytest

from library.training.setup import text_encoder_rates


@pytest.mark.parametrize(
    ("rates", "count", "expected"),
    [
        (None, 2, [1e-3, 1e-3]),
        (5e-5, 2, [5e-5, 5e-5]),
        ([5e-5], 2, [5e-5, 5e-5]),
        ([5e-5, 1e-5], 2, [5e-5, 1e-5]),
        ([5e-5, 1e-5], 3, [5e-5, 1e-5, 1e-5]),
        ([5e-5, 5e-5], 1, [5e-5]),
        ([5e-5, 1e-5], 1, [5e-5]),
        ([5e-5, 1e-5, 2e-5], 2, [5e-5, 1e-5]),
    ],
)
def test_rates_per_encoder(rates, count, expected):
    assert text_encoder_rates(rates, 1e-3, count) == expected


def test_unused_rates_are_named_only_when_they_differ(caplog):
    with caplog.at_level(logging.WARNING):
        text_encoder_rates([5e-5, 5e-5], 1e-3, 1)  # the GUI's SD 1.5 value: nothing to say
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        text_encoder_rates([5e-5, 1e-5, 2e-5], 1e-3, 2)
    (record,) = caplog.records
    assert "3 rates but the model has 2 text encoders: 2e-05 not used" in record.getMessage()
