"""``_nb_argsort_desc`` (the order every runtime partition starts from) against the plain
definition, descending by value with ties by index, over values its counting-sort path must
not take: negatives, fractions that share a floor, values past its small-integer bound, and
no value at all.

Bugs these catch: fractions sorted by their floor (2.5 after 2.0 when it comes later), a
negative value indexed into the counts, the empty case returning something else than an empty
index array, ties broken by something else than the index."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing import _kernels as K
from balancing import _reference as R


def _check(values):
    x = np.asarray(values, dtype=np.float64)
    got = K._nb_argsort_desc(x)
    assert got.dtype == np.int64
    assert got.tolist() == R.argsort_desc(x.tolist())


def test_no_value_is_an_empty_index_array():
    got = K._nb_argsort_desc(np.zeros(0))
    assert got.dtype == np.int64 and got.shape == (0,)


def test_fractions_sharing_a_floor_and_negatives_by_hand():
    _check([2.0, 2.5, 2.25, 3.0])  # one floor, three values
    _check([1.0, -1.0, 0.0, -2.0, 1.0])
    _check([0.5])
    _check([70000.0, 3.0, 70000.0])  # past the counting path's bound (4n + 65536)
    # far past it, among 60 values: a count per possible value would be petabytes
    _check([1e15, *range(58), 2.0**60])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 40).map(float),  # small whole numbers: the counting path, ties
            st.integers(-5, 5).map(float),
            st.floats(0, 50, allow_nan=False).map(lambda v: round(v * 4) / 4),
            st.integers(60000, 80000).map(float),
        ),
        max_size=60,
    )
)
def test_any_values_sort_descending_ties_by_index(values):
    _check(values)
