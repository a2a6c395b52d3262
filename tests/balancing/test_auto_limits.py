"""``auto``'s three documented limits at, below and above them: the equal-count KK second
opinion on steps of at most ``AUTO_SECOND_OPINION`` items, the unequal KK where items x batches
is at most ``AUTO_KK_WORK``, neither where LPT's heaviest batch is within ``AUTO_ENOUGH`` of the
lower bound (checked against brute force); and neither when LPT already meets the tolerance or
a cap is set.

Which methods ran is seen by spying on the second opinions' kernel and its twin (the bits of
what they tried; the plan alone cannot show it: a second opinion that gains nothing keeps LPT's
plan). Bugs these catch: either limit off
by one or by any amount, the second opinion run on steps LPT already balanced, or under a
cap."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from balancing import twins
from balancing._kernels.auto import KK, KK_EQUAL
from balancing.post_balance import (
    AUTO_ENOUGH,
    AUTO_KK_WORK,
    AUTO_SECOND_OPINION,
    lower_bound,
    post_balance,
)

# the documented limits, written here apart from the module's constants (a changed constant
# must fail a test, not move the test along with it)
ITEMS, WORK, ENOUGH = 1024, 65_536, 1e-3


def test_the_limits_are_the_documented_ones():
    assert (AUTO_SECOND_OPINION, AUTO_KK_WORK, AUTO_ENOUGH) == (ITEMS, WORK, ENOUGH)


# the module (balancing re-exports a function of the same name)
pb = importlib.import_module("balancing.post_balance")


@pytest.fixture
def kk_calls(monkeypatch) -> list[bool]:
    """The ``equal`` flag of every Karmarkar-Karp run among the second opinions, kernel or
    twin (as the ``tried`` bits they return say)."""
    calls: list[bool] = []
    kernel, twin = pb._nb_second_opinion, twins.second_opinion

    def seen(got):
        tried = got[2]
        calls.extend(e for e, code in ((True, KK_EQUAL), (False, KK)) if tried & (1 << code))
        return got

    monkeypatch.setattr(pb, "_nb_second_opinion", lambda *a: seen(kernel(*a)))
    monkeypatch.setattr(twins, "second_opinion", lambda *a: seen(twin(*a)))
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
    x = _kk_case(n, 64)
    order = np.argsort(-x, kind="stable")
    lpt = post_balance(x, 64, method="lpt").loads.max()
    assert lpt > lower_bound(x, order, 64) * (1 + 2 * ENOUGH)  # the bound does not settle it
    post_balance(x, 64, method="auto")
    assert (True in kk_calls) is second, kk_calls


def _kk_case(n: int, d: int) -> np.ndarray:
    """Lengths 1-5 over d batches: a mean of ~3n/d, a fraction of a unit (1/d) from any integer
    max, far above 2e-5 of it, so neither LPT nor equal KK meets the tolerance."""
    x = np.random.default_rng(n * d).integers(1, 6, n).astype(np.float64)
    if int(x.sum()) % d == 0:
        x[0] += 1
    return x


@pytest.mark.parametrize(("where", "second"), [("below", True), ("at", False), ("above", False)])
def test_no_second_opinion_where_lpt_is_within_enough_of_the_bound(
    kk_calls, monkeypatch, where, second
):
    """A bound at which LPT's heaviest batch is exactly ``bound x (1 + AUTO_ENOUGH)`` (the
    smallest such float), one float below it and above it: below, the second opinion runs; at
    and above, LPT's plan is kept without one (no plan can be more even by more than
    AUTO_ENOUGH). The bound is set through the module so the cases sit at the limit."""
    x = _kk_case(200, 8)
    top = post_balance(x, 8, method="lpt").loads.max()
    at = top / (1 + ENOUGH)
    while at * (1 + ENOUGH) < top:
        at = np.nextafter(at, np.inf)
    while np.nextafter(at, 0.0) * (1 + ENOUGH) >= top:
        at = np.nextafter(at, 0.0)
    bound = {"below": np.nextafter(at, 0.0), "at": at, "above": at * (1 + 1e-9)}[where]
    monkeypatch.setattr(pb, "lower_bound", lambda *a: bound)
    r = post_balance(x, 8, method="auto")
    assert (True in kk_calls) is second, (where, kk_calls)
    if not second:
        assert r.method == "lpt"


def _brute_force_best(x: list[float], d: int) -> float:
    import itertools

    best = float("inf")
    for dest in itertools.product(range(d), repeat=len(x)):
        loads = [0.0] * d
        for v, b in zip(x, dest, strict=True):
            loads[b] += v
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_lower_bound_is_never_above_the_best_plan(seed):
    """Brute force over every assignment (up to 3^8): the most even plan's heaviest batch is
    never below ``lower_bound``; on steps where the pigeonhole term decides (few items a batch)
    the bound is the optimum itself."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 4))
    n = int(rng.integers(1, 9))
    x = np.round(np.exp(rng.normal(3, 1.0, n))) if seed % 2 else rng.integers(1, 5, n) * 1.0
    lb = lower_bound(x, np.argsort(-x, kind="stable"), d)
    best = _brute_force_best(x.tolist(), d)
    assert lb <= best * (1 + 1e-12), (x.tolist(), d, lb, best)


def test_the_lower_bound_is_tight_where_items_are_equal_or_one_dominates():
    order = lambda x: np.argsort(-x, kind="stable")  # noqa: E731
    x = np.full(9, 5.0)  # 9 equal items on 4 batches: one holds 3
    assert lower_bound(x, order(x), 4) == 15.0 == _brute_force_best(x.tolist(), 4)
    x = np.array([100.0, 1.0, 1.0, 1.0])  # the largest item alone
    assert lower_bound(x, order(x), 2) == 100.0
    x = np.array([3.0, 3.0, 2.0, 2.0, 2.0])  # the mean
    assert lower_bound(x, order(x), 2) == 6.0 == _brute_force_best(x.tolist(), 2)
    x = np.array([6.0, 5.0, 4.0])  # the two lightest of the three heaviest share a batch
    assert lower_bound(x, order(x), 2) == 9.0 == _brute_force_best(x.tolist(), 2)
    # an odd number of batches (k * d odd: the k * d + 1 heaviest are not one fewer or more)
    x = np.full(4, 10.0)  # 4 items on 3 batches: two share one
    assert lower_bound(x, order(x), 3) == 20.0 == _brute_force_best(x.tolist(), 3)
    x = np.array([10.0, 10.0, 10.0, 10.0, 10.0, 9.0, 1.0])  # 7 on 5: the 9 shares with a 10
    assert lower_bound(x, order(x), 5) == 19.0 == _brute_force_best(x.tolist(), 5)


def test_the_lower_bound_of_no_items_is_zero_in_the_kernel_and_its_twin():
    from balancing import _kernels as K

    empty = np.zeros(0)
    assert K._nb_lower_bound(empty, np.zeros(0, np.int64), 3) == 0.0
    assert twins.lower_bound(empty, np.zeros(0, np.int64), 3) == 0.0
    assert lower_bound(empty, np.zeros(0, np.int64), 3) == 0.0


@pytest.mark.parametrize("which", ["kernel", "twin"])
def test_no_later_opinion_runs_once_the_best_is_at_the_target(which):
    """The home start and unequal KK run only while the best so far is above the target: with
    the caller's plan exactly at it, equal KK runs and nothing after it; one float above it,
    every opinion runs (a target below any plan's heaviest batch: none of them wins)."""
    from balancing import _kernels as K

    x = np.array([5.0, 4.0, 3.0, 3.0, 3.0, 2.0])  # 20 on 2 batches: no batch below 10
    order, d, target = np.argsort(-x, kind="stable"), 2, 9.0
    second = K._nb_second_opinion if which == "kernel" else twins.second_opinion
    every = (1 << 1) | (1 << 2) | (1 << 3)
    for top, want in ((target, 1 << 1), (np.nextafter(target, np.inf), every)):
        dest = np.zeros(x.size, dtype=np.int64)
        code, _, tried = second(x, order, d, target, 8, True, top, dest)
        assert (code, tried) == (0, want), (top, tried)
        assert not dest.any()  # no opinion won: the plan is left as it was


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
