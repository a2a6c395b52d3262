"""``post_balance``'s settings: their defaults, their limits at, below and above them, and a
method named by a string that is equal to, not the same object as, the literal.

Bugs these catch (each survived the rest of the suite under cosmic-ray): a negative memory cap
accepted; the refinement's default budget (4 x d moves) or the quadratic method's default
tie tolerance (1 % of the mean batch) changed; ``auto`` running its second opinion on steps
LPT already balanced within a non-zero tolerance; a method compared by identity (a name read
from a config file then picks the wrong Karmarkar-Karp)."""

from __future__ import annotations

import importlib
import json
import threading

import numpy as np
import pytest

from balancing import first_call, twins
from balancing.post_balance import post_balance

pb = importlib.import_module("balancing.post_balance")


@pytest.mark.parametrize("cap", [-1e-9, -0.5, -1.0, -2.0, float("nan"), float("inf")])
def test_a_memory_cap_below_zero_or_not_finite_is_refused(cap):
    with pytest.raises(ValueError, match="memory_cap must be finite and >= 0"):
        post_balance(np.ones(4), 2, memory_cap=cap)


@pytest.mark.parametrize("cap", [0.0, None])
def test_a_memory_cap_of_zero_or_none_is_no_cap(cap):
    x = np.array([5.0, 4.0, 3.0, 3.0])
    assert post_balance(x, 2, memory_cap=cap).loads.tolist() == [8.0, 7.0]


def _kk_equal_case() -> np.ndarray:
    """Lengths on which equal-count KK's refinement is cut short by its budget: 4 x d swaps end
    above where 5 x d end (found by search; the check below keeps the test honest)."""
    rng = np.random.default_rng(9)
    d = int(rng.integers(2, 8))
    n = int(rng.integers(d, 20 * d))
    assert (d, n) == (4, 70)
    return np.round(np.exp(rng.normal(5, 2.0, n))) + rng.integers(0, 3, n)


def test_the_refinement_budget_defaults_to_four_moves_per_batch():
    x, d = _kk_equal_case(), 4
    got = post_balance(x, d, method="kk_equal", tolerance=0.0)
    four = post_balance(x, d, method="kk_equal", tolerance=0.0, max_swaps=4 * d)
    five = post_balance(x, d, method="kk_equal", tolerance=0.0, max_swaps=5 * d)
    three = post_balance(x, d, method="kk_equal", tolerance=0.0, max_swaps=3 * d)
    assert five.loads.max() < four.loads.max() or three.loads.max() > four.loads.max()
    np.testing.assert_array_equal(got.dest, four.dest)


def test_the_quadratic_tie_tolerance_defaults_to_one_percent_of_the_mean_batch():
    hits = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        d = int(rng.integers(2, 6))
        x = np.round(np.exp(rng.normal(5, 1.2, int(rng.integers(d, 10 * d)))))
        mean = x.sum() / d
        got = post_balance(x, d, method="quadratic")
        want = post_balance(x, d, method="quadratic", quadratic_tolerance=0.01 * mean)
        np.testing.assert_array_equal(got.dest, want.dest)
        other = post_balance(x, d, method="quadratic", quadratic_tolerance=0.2 * mean)
        hits += not np.array_equal(other.dest, want.dest)
    assert hits, "the tolerance changes no plan here: the test would be blind"


def test_auto_keeps_lpt_within_a_nonzero_tolerance_without_a_second_opinion(monkeypatch):
    """LPT's heaviest batch 2.4 % above the mean (20.5: not a whole number), tolerance 3 %:
    within it, so no KK runs (not only when LPT is exact; a mean floored to 20 would not be)."""
    calls = []
    monkeypatch.setattr(pb, "_nb_second_opinion", lambda *a: calls.append(a))
    monkeypatch.setattr(twins, "second_opinion", lambda *a: calls.append(a))
    x = np.array([10.0, 10.0, 10.0, 11.0])  # LPT: 11 + 10 = 21 | 20; mean 20.5: 2.4 % above
    r = post_balance(x, 2, method="auto", tolerance=0.03)
    assert r.method == "lpt" and r.loads.max() == 21.0 and calls == []


@pytest.mark.parametrize("mode", ["python", "kernels"])
def test_a_method_named_by_an_equal_string_is_that_method(monkeypatch, mode):
    """A method name read from a file (equal to the literal, another object) runs that method:
    equal-count KK gives every batch the same count, on the kernels and on their twins."""
    monkeypatch.setenv("EQUISHARD_FIRST_CALL", mode)
    monkeypatch.setattr(first_call, "_READY", threading.Event())  # as in a fresh process
    assert first_call.kernels_ready() is (mode == "kernels")
    x = np.round(np.exp(np.random.default_rng(0).normal(5, 2.0, 40)))
    names = '["kk_equal", "kk", "lpt", "best", "auto", "padded", "quadratic", "padded_attention"]'
    for name in json.loads(names):
        literal = next(m for m in pb.METHODS if m == name)
        assert literal is not name
        r = post_balance(x, 4, method=name)
        same = post_balance(x, 4, method=literal)
        assert (r.dest.tolist(), r.method) == (same.dest.tolist(), same.method), name
        if name == "kk_equal":
            assert r.method == "kk_equal" and np.bincount(r.dest, minlength=4).tolist() == [10] * 4


@pytest.mark.parametrize("seed", range(12))
def test_each_unrefined_method_is_its_algorithm(seed):
    """``quadratic``, ``padded_attention`` and ``padded`` are OrchMLLM's Alg. 4, 5 and 2 as the
    plain-Python reference computes them (quadratic's tolerance 1 % of the mean batch,
    padded attention bounded by LPT's heaviest batch), not one run for another."""
    from balancing import _reference as R

    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 7))
    x = np.round(np.exp(rng.normal(5, 1.5, int(rng.integers(d, 12 * d)))))
    order = R.argsort_desc(x.tolist())
    lengths = x.tolist()
    lpt_loads = [0.0] * d
    for i, b in R.lpt(lengths, order, d).items():
        lpt_loads[b] += lengths[i]
    want = {
        "quadratic": R.lpt_quadratic(lengths, order, d, 0.01 * x.sum() / d),
        "padded_attention": R.padded_attention(lengths, order, d, max(lpt_loads)),
    }
    asc = order[::-1]
    _, runs = R.padded_batches([lengths[i] for i in asc], d)
    want["padded"] = {i: r for i, r in zip(asc, runs, strict=True)}
    for method, ref in want.items():
        got = post_balance(x, d, method=method)
        assert got.method == method
        assert {i: int(b) for i, b in enumerate(got.dest)} == ref, method


@pytest.mark.parametrize("name", ["max_count", "max_swaps"])
def test_counts_below_zero_are_refused_by_name_and_zero_is_allowed(name):
    with pytest.raises(ValueError, match=rf"{name} must be a whole number or None >= 0, got -1"):
        post_balance(np.ones(4), 2, **{name: -1})
    assert post_balance(np.zeros(0), 2, **{name: 0}).dest.size == 0  # no items: 0 fits
    if name == "max_swaps":  # no refinement step: LPT as it stands; the default swaps a 3
        x = np.array([3.0, 3.0, 2.0, 2.0, 2.0])
        assert post_balance(x, 2, method="lpt", max_swaps=0).loads.tolist() == [7.0, 5.0]
        assert post_balance(x, 2, method="lpt").loads.tolist() == [6.0, 6.0]


@pytest.mark.parametrize("seed", [27280])
def test_autos_second_opinion_refines_with_the_default_budget_too(seed):
    """``auto``'s equal-count KK is refined with the same default budget, 4 x d moves, as
    every method (a step found by search, 1 in 60,000 draws, where the budget decides which
    plan auto keeps: most steps LPT settles within AUTO_ENOUGH of the lower bound)."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 8))
    n = int(rng.integers(d, 20 * d))
    x = np.round(np.exp(rng.normal(5, 2.0, n))) + rng.integers(0, 3, n)
    got = post_balance(x, d, method="auto", tolerance=0.0)
    four = post_balance(x, d, method="auto", tolerance=0.0, max_swaps=4 * d)
    five = post_balance(x, d, method="auto", tolerance=0.0, max_swaps=5 * d)
    assert (got.dest.tolist(), got.method) == (four.dest.tolist(), four.method)
    assert (five.dest.tolist(), five.method) != (four.dest.tolist(), four.method)


@pytest.mark.parametrize("seed", range(16))
def test_each_refined_method_is_its_algorithm_then_the_refinement(seed):
    """``lpt``, ``kk`` and ``kk_equal`` as the plain-Python reference computes them: the
    partition, then (where its heaviest batch is above the tolerance) the refinement with
    moves and swaps, swaps only for ``kk_equal`` (equal counts stay equal), 4 x d steps."""
    from balancing import _reference as R

    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 7))
    x = np.round(np.exp(rng.normal(5, 1.5, int(rng.integers(d, 12 * d)))))
    lengths, order = x.tolist(), R.argsort_desc(x.tolist())
    target = x.sum() / d * (1.0 + 2e-5)
    starts = {
        "lpt": R.lpt(lengths, order, d),
        "kk": R.karmarkar_karp(lengths, order, d, False),
        "kk_equal": R.karmarkar_karp(lengths, order, d, True),
    }
    for method, start in starts.items():
        bins, loads = _ref_partition(lengths, order, d, start, target, method != "kk_equal")
        got = post_balance(x, d, method=method)
        assert got.loads.tolist() == list(loads), method
        for b in range(d):  # the same lengths in each batch (equal lengths may trade places)
            mine = sorted(x[got.dest == b].tolist())
            assert mine == sorted(lengths[i] for i in range(x.size) if bins[i] == b), method


@pytest.mark.parametrize("seed", range(8))
def test_padded_loads_are_count_times_longest(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 6))
    x = np.round(np.exp(rng.normal(5, 1.5, int(rng.integers(d, 10 * d)))))
    got = post_balance(x, d, method="padded")
    want = [
        float(np.sum(got.dest == b) * x[got.dest == b].max()) if (got.dest == b).any() else 0.0
        for b in range(d)
    ]
    assert got.loads.tolist() == want
    assert pb.batch_loads(x, got.dest, d, padded=True).tolist() == want


@pytest.mark.parametrize("tolerance", [-1e-9, -1.0, float("nan"), float("inf")])
def test_a_tolerance_below_zero_or_not_finite_is_refused(tolerance):
    with pytest.raises(ValueError, match="tolerance must be finite and >= 0"):
        post_balance(np.ones(4), 2, tolerance=tolerance)


def _ref_partition(lengths, order, d, start, target, moves):
    """A reference partition (item -> bin) refined as post_balance documents it."""
    from balancing import _reference as R

    bins = [start[i] for i in range(len(lengths))]
    loads = [0.0] * d
    for i, b in enumerate(bins):
        loads[b] += lengths[i]
    if max(loads) > target:
        bins, loads = R.refine(lengths, order, bins, d, target, 4 * d, 0.0, lengths, 0, moves)
    return bins, list(loads)


def _reference_bound(lengths: list[float], d: int) -> float:
    """The load no plan's heaviest batch is below, as documented, in plain Python: the mean,
    the largest item, and for each k the k + 1 lightest of the k * d + 1 heaviest items."""
    desc = sorted(lengths, reverse=True)
    bound = max(sum(desc) / d, desc[0])
    k = 1
    while k * d + 1 <= len(desc):
        bound = max(bound, sum(desc[k * d - k : k * d + 1]))
        k += 1
    return bound


def reference_auto(x: np.ndarray, d: int, tolerance: float):
    """``auto`` as the module docstring describes it, from the plain-Python reference: refined
    LPT; on steps of at most 1,024 items it leaves above the tolerance and more than 0.1 % above
    the lower bound, also equal-count KK refined with moves, the locality start (the i-th of n
    items kept on batch i * d // n up to the mean, the rest onto the lightest: the reference's
    local_first with one node) refined with moves, and where items x batches <= 65,536 the
    unequal KK (refined), each tried while the best so far is above the tolerance, keeping the
    most even (the earlier on ties)."""
    from balancing import _reference as R

    lengths, order = x.tolist(), R.argsort_desc(x.tolist())
    n = len(lengths)
    target = x.sum() / d * (1.0 + tolerance)
    best = _ref_partition(lengths, order, d, R.lpt(lengths, order, d), target, True)
    if n > 1024 or max(best[1]) <= target:
        return best
    if max(best[1]) <= _reference_bound(lengths, d) * (1 + 1e-3):
        return best
    kke = _ref_partition(lengths, order, d, R.karmarkar_karp(lengths, order, d, True), target, True)
    if max(kke[1]) < max(best[1]):
        best = kke
    if max(best[1]) > target:
        src = [i * d // n for i in range(n)]
        start, _ = R.local_first(lengths, order, src, d, d, target)
        home = _ref_partition(lengths, order, d, start, target, True)
        if max(home[1]) < max(best[1]):
            best = home
    if n * d <= 65_536 and max(best[1]) > target:
        kk = _ref_partition(
            lengths, order, d, R.karmarkar_karp(lengths, order, d, False), target, True
        )
        if max(kk[1]) < max(best[1]):
            best = kk
    return best


# 1785: the one seed in 3,000 where equal KK's refinement stops at the tolerance and that
# changes the plan auto keeps (found by search, at tolerance 0.01); 202, 266, 581: the locality
# start is the most even (the first three in 3,000); 0, 1, 2: LPT within 0.1 % of the bound
@pytest.mark.parametrize("tolerance", [2e-5, 0.01, 0.05])
@pytest.mark.parametrize("seed", [*range(10), 1785, 202, 266, 581])
def test_auto_is_the_documented_procedure(seed, tolerance):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 9))
    x = np.round(np.exp(rng.normal(5, 2.0, int(rng.integers(d, 16 * d)))))
    bins, loads = reference_auto(x, d, tolerance)
    got = post_balance(x, d, method="auto", tolerance=tolerance)
    assert got.loads.tolist() == loads
    for b in range(d):  # the same lengths in each batch (equal lengths may trade places)
        assert sorted(x[got.dest == b].tolist()) == sorted(x[np.array(bins) == b].tolist())


@pytest.mark.parametrize(("cap", "fits"), [(2.0, True), (1.9, False), (2.1, True)])
def test_a_memory_cap_that_the_total_fills_exactly_is_allowed(cap, fits):
    """Total memory 4 over 2 ranks: a cap of 2 (at the total's share) fits, 1.9 cannot."""
    x = np.ones(4)
    if fits:
        assert post_balance(x, 2, memory_cap=cap).loads.tolist() == [2.0, 2.0]
    else:
        with pytest.raises(pb.MemoryCapError, match="cannot fit 2 ranks"):
            post_balance(x, 2, memory_cap=cap)


def test_imbalance_is_the_heaviest_over_the_mean_and_one_with_nothing_to_balance():
    x = np.array([3.0, 1.0, 1.0, 1.0])
    r = post_balance(x, 2, method="lpt")
    assert r.loads.tolist() == [3.0, 3.0] and r.imbalance == 1.0
    r = post_balance(np.array([4.0, 1.0]), 2, method="lpt")
    assert r.imbalance == 4.0 / 2.5
    assert post_balance(np.zeros(3), 2).imbalance == 1.0  # nothing to do: even
    assert post_balance(np.zeros(0), 2).imbalance == 1.0
    assert pb.PostBalance(np.zeros(0, int), np.zeros(0), "lpt").imbalance == 1.0


def test_batch_loads_are_sums_unless_padded():
    x, dest = np.array([5.0, 1.0, 2.0]), np.array([0, 0, 1])
    assert pb.batch_loads(x, dest, 2).tolist() == [6.0, 2.0]
    assert pb.batch_loads(x, dest, 2, padded=True).tolist() == [10.0, 2.0]
    with pytest.raises(TypeError):  # padded by keyword only
        pb.batch_loads(x, dest, 2, True)  # type: ignore[misc]


@pytest.mark.parametrize("n_memory", [3, 5])
def test_memory_of_another_length_than_the_lengths_is_refused(n_memory):
    with pytest.raises(ValueError, match=rf"memory has {n_memory} items, lengths 4"):
        post_balance(np.ones(4), 2, memory=np.ones(n_memory), memory_cap=10.0)


def test_lpt_that_fits_no_rank_after_some_items_names_how_many_it_placed():
    """Each item fits alone and the total fits the ranks, but greedy placement runs out at the
    fifth item: a MemoryCapError after 4 placed, not a plan with an item left out."""
    x = np.array([3.0, 3.0, 2.0, 2.0, 2.0])
    with pytest.raises(pb.MemoryCapError, match="after placing the 4 larger items"):
        post_balance(x, 2, method="lpt", memory_cap=6.0)


@pytest.mark.parametrize("method", ["lpt", "auto", "kk", "padded", "quadratic"])
def test_a_memory_cap_of_one_or_below_binds_like_any_other(method):
    """Memory in other units than the lengths (here below 1 per item): a cap of 1.0 or 0.9 is a
    cap, honoured by every method (LPT builds under it; the others fall back to it)."""
    x = np.array([4.0, 3.0, 2.0, 1.0])
    mem = np.array([0.6, 0.1, 0.1, 0.6])  # LPT by length pairs items 0 and 3: 1.2
    for cap in (1.0, 0.9):
        r = post_balance(x, 2, method=method, memory=mem, memory_cap=cap)
        assert np.bincount(r.dest, weights=mem, minlength=2).max() <= cap, (method, cap)


def test_a_plan_within_a_loose_count_cap_is_kept():
    """A method that cannot build under caps keeps its own plan when it honours them (the
    count compared by value): padded with at most n per batch is padded."""
    x = np.round(np.exp(np.random.default_rng(2).normal(5, 1.0, 24)))
    r = post_balance(x, 4, method="padded", max_count=24)
    assert r.method == "padded"


def test_the_settings_are_keyword_only():
    with pytest.raises(TypeError):
        post_balance(np.ones(4), 2, "lpt")  # type: ignore[misc]


def test_a_result_is_frozen():
    import dataclasses

    r = post_balance(np.ones(4), 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.method = "other"  # type: ignore[misc]


@pytest.mark.parametrize("cap", [0.5, 1.0])
def test_an_item_over_a_small_cap_alone_is_named_before_any_placement(cap):
    mem = np.array([0.2, cap + 0.1, 0.1])
    with pytest.raises(pb.MemoryCapError, match=rf"item 1 needs {cap + 0.1:g} alone"):
        post_balance(np.ones(3), 2, memory=mem, memory_cap=cap)
    with pytest.raises(pb.MemoryCapError, match="cannot fit 2 ranks"):
        post_balance(np.ones(3), 2, memory=np.full(3, cap * 0.9), memory_cap=cap)


@pytest.mark.parametrize("cap", ["max_count", "memory_cap"])
def test_best_under_a_cap_is_lpt_under_it(cap):
    """``best`` compares LPT with equal-count KK, which takes no cap: under one, LPT alone."""
    x = np.round(np.exp(np.random.default_rng(3).normal(5, 1.0, 20)))
    kw = {"max_count": 6} if cap == "max_count" else {"memory_cap": float(x.sum())}
    got = post_balance(x, 4, method="best", **kw)
    want = post_balance(x, 4, method="lpt", **kw)
    assert (got.dest.tolist(), got.method) == (want.dest.tolist(), "lpt")
