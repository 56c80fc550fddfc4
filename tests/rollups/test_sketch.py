"""The latency sketch's percentiles stay within the stated 2 % of percentile_cont's, and taking
durations out leaves the sketch of the rest."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.rollups import sketch
from pipeline.stats import interpolate

durations = st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e7)), min_size=1, max_size=300)


def sketch_of(values: list[float]) -> Counter:
    return Counter(sketch.bucket_of(v) for v in values)


@given(durations, st.floats(0, 1))
def test_a_percentile_is_within_two_percent_of_the_exact_one(values, q):
    (estimate,) = sketch.quantiles(sketch_of(values), [q])
    exact = interpolate(sorted(values), q)
    assert abs(estimate - exact) <= sketch.ALPHA * exact + 1e-9


@given(durations, durations)
def test_taking_durations_out_leaves_the_sketch_of_the_rest(kept, removed):
    both = sketch_of(kept + removed)
    sketch.merge(both, sketch_of(removed), sign=-1)
    assert both == sketch_of(kept)


def test_an_empty_sketch_has_no_percentiles():
    assert sketch.quantiles({}, [0.5, 0.99]) == [None, None]


@pytest.mark.parametrize("value", [1e-3, 0.5, 1.0, 37.2, 5_000.0, 9e6])
def test_every_bucket_value_is_within_alpha_of_what_it_holds(value):
    # at a bucket's upper bound the error is ALPHA exactly: allow for rounding only
    assert abs(sketch.value_of(sketch.bucket_of(value)) - value) <= sketch.ALPHA * value * (1 + 1e-12)
