"""``auto``'s two documented limits at, below and above them: the equal-count KK second opinion
on steps of at most ``AUTO_SECOND_OPINION`` items, the unequal KK where items x batches is at
most ``AUTO_KK_WORK``; and neither when LPT already meets the tolerance or a cap is set.

Which methods ran is seen by spying on the KK kernel and its twin (the plan alone cannot show
it: a second opinion that gains nothing keeps LPT's plan). Bugs these catch: either limit off
by one or by any amount, the second opinion run on steps LPT already balanced, or under a
cap."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from balancing import twins
from balancing.post_balance import AUTO_KK_WORK, AUTO_SECOND_OPINION, post_balance

# the documented limits, written here apart from the module's constants (a changed constant
# must fail a test, not move the test along with it)
ITEMS, WORK = 1024, 65_536


def test_the_limits_are_the_documented_ones():
    assert (AUTO_SECOND_OPINION, AUTO_KK_WORK) == (ITEMS, WORK)


# the module (balancing re-exports a function of the same name)
pb = importlib.import_module("balancing.post_balance")


@pytest.fixture
def kk_calls(monkeypatch) -> list[bool]:
    """The ``equal`` flag of every Karmarkar-Karp run, kernel or twin."""
    calls: list[bool] = []
    kernel, twin = pb._nb_karmarkar_karp, twins.karmarkar_karp

    def spy_kernel(x, order, d, equal, dest):
        calls.append(bool(equal))
        return kernel(x, order, d, equal, dest)

    def spy_twin(x, order, d, equal):
        calls.append(bool(equal))
        return twin(x, order, d, equal)

    monkeypatch.setattr(pb, "_nb_karmarkar_karp", spy_kernel)
    monkeypatch.setattr(twins, "karmarkar_karp", spy_twin)
    return calls


def _unbalanceable(n: int, seed: int = 0) -> np.ndarray:
    """n small integer lengths whose sum is odd: two batches cannot be within 2e-5 of the mean
    (the heavier holds at least half a unit more, far above 2e-5 of a mean of ~1,500)."""
    x = np.random.default_rng(seed).integers(1, 6, n).astype(np.float64)
    if int(x.sum()) % 2 == 0:
        x[0] += 1
    return x


@pytest.mark.parametrize(
    ("n", "second"),
    [(ITEMS - 1, True), (ITEMS, True), (ITEMS + 1, False)],
)
def test_the_second_opinion_runs_up_to_its_item_limit(kk_calls, n, second):
    post_balance(_unbalanceable(n), 2, method="auto")
    assert (True in kk_calls) is second, kk_calls


def _kk_case(n: int, d: int) -> np.ndarray:
    """Lengths 1-5 over d batches: a mean of ~3n/d, a fraction of a unit (1/d) from any integer
    max, far above 2e-5 of it, so neither LPT nor equal KK meets the tolerance."""
    x = np.random.default_rng(n * d).integers(1, 6, n).astype(np.float64)
    if int(x.sum()) % d == 0:
        x[0] += 1
    return x


@pytest.mark.parametrize(
    ("n", "d", "unequal"),
    [
        (WORK // 64 - 1, 64, True),  # 65,472 = below
        (WORK // 64, 64, True),  # 65,536 = at
        (1009, 65, False),  # 65,585 = above, with n within the second opinion's limit
    ],
)
def test_unequal_kk_runs_up_to_its_work_limit(kk_calls, n, d, unequal):
    assert (n * d <= WORK) is unequal and n <= ITEMS
    post_balance(_kk_case(n, d), d, method="auto")
    assert True in kk_calls  # the second opinion ran (the step stays above the tolerance)
    assert (False in kk_calls) is unequal, kk_calls


def test_no_second_opinion_where_lpt_meets_the_tolerance(kk_calls):
    x = np.full(64, 10.0)  # 8 per batch: exact
    r = post_balance(x, 8, method="auto")
    assert r.method == "lpt" and r.loads.max() == 80.0 and kk_calls == []


@pytest.mark.parametrize("cap", ["max_count", "memory_cap"])
def test_no_second_opinion_under_a_cap(kk_calls, cap):
    x = _unbalanceable(101)
    # a memory cap below 1 (of memory in other units than the lengths) is a cap all the same
    mem = {"memory": x / 1000.0, "memory_cap": 1.0}
    kwargs = {"max_count": 60} if cap == "max_count" else mem
    r = post_balance(x, 2, method="auto", **kwargs)
    assert r.method == "lpt" and kk_calls == []
