"""Runtime post-balancing: partitions, bounds and caps as properties (hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing.post_balance import METHODS, MemoryCapError, batch_loads, post_balance

lengths_st = st.lists(st.integers(min_value=0, max_value=5000), min_size=0, max_size=300)


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_st, d=st.integers(1, 24), method=st.sampled_from(METHODS))
def test_every_method_partitions_the_input(lengths, d, method):
    x = np.array(lengths, dtype=np.float64)
    r = post_balance(x, d, method=method)
    assert r.dest.shape == x.shape and (r.dest >= 0).all() and (r.dest < d).all()
    padded = r.method == "padded"
    assert np.allclose(r.loads, batch_loads(x, r.dest, d, padded=padded))
    if not padded:
        assert np.isclose(r.loads.sum(), x.sum())


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_st.filter(bool), d=st.integers(1, 24))
def test_lpt_within_grahams_list_scheduling_bound(lengths, d):
    x = np.array(lengths, dtype=np.float64)
    bound = x.sum() / d + (1 - 1 / d) * x.max()  # holds for any list schedule, LPT included
    for method in ("lpt", "best", "auto"):
        r = post_balance(x, d, method=method)
        assert r.loads.max() <= bound + 1e-9


def _optimal_makespan(x: list[int], d: int) -> int:
    best = sum(x)

    def place(i: int, loads: list[int]) -> None:
        nonlocal best
        if max(loads) >= best:
            return
        if i == len(x):
            best = max(loads)
            return
        for j in range(d):
            if j and loads[j] == loads[j - 1]:
                continue  # symmetric to the previous bin
            loads[j] += x[i]
            place(i + 1, loads)
            loads[j] -= x[i]

    place(0, [0] * d)
    return best


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=9),
    d=st.integers(1, 4),
)
def test_lpt_within_four_thirds_of_the_optimum(lengths, d):
    x = sorted(lengths, reverse=True)
    opt = _optimal_makespan(x, d)
    for method in ("lpt", "best", "auto"):
        r = post_balance(np.array(lengths, dtype=np.float64), d, method=method)
        assert r.loads.max() <= (4 / 3 - 1 / (3 * d)) * opt + 1e-9


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st.filter(bool), d=st.integers(1, 16), extra=st.integers(0, 3))
def test_count_cap_holds(lengths, d, extra):
    x = np.array(lengths, dtype=np.float64)
    cap = -(-x.size // d) + extra
    r = post_balance(x, d, method="lpt", max_count=cap)
    assert np.bincount(r.dest, minlength=d).max() <= cap


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st.filter(bool), d=st.integers(1, 16), slack=st.floats(1.0, 2.0))
def test_memory_cap_holds_or_raises_clearly(lengths, d, slack):
    x = np.array(lengths, dtype=np.float64) + 1
    mem = x[::-1].copy()
    cap = max(mem.max(), mem.sum() / d) * slack
    try:
        r = post_balance(x, d, method="lpt", memory_cap=cap, memory=mem)
    except MemoryCapError as exc:
        assert "memory cap" in str(exc)
        return
    assert np.bincount(r.dest, weights=mem, minlength=d).max() <= cap + 1e-9


def test_memory_cap_impossible_is_a_clear_error():
    with pytest.raises(MemoryCapError, match="alone"):
        post_balance(np.array([10.0, 1.0]), 2, memory_cap=5)
    with pytest.raises(MemoryCapError, match="in total"):
        post_balance(np.array([5.0, 5.0, 5.0]), 2, memory_cap=6)


def test_refinement_reaches_tight_balance_on_real_like_lengths():
    rng = np.random.default_rng(0)
    x = rng.integers(293, 1833, 64 * 60).astype(np.float64)
    r = post_balance(x, 64, method="lpt")
    assert r.imbalance <= 1.0001
    plain = post_balance(x, 64, method="lpt", max_swaps=0)
    assert r.loads.max() <= plain.loads.max()


def test_deterministic():
    x = np.random.default_rng(1).integers(1, 3000, 1000).astype(float)
    a, b = post_balance(x, 16), post_balance(x.copy(), 16)
    assert (a.dest == b.dest).all()


def test_hand_worked_lpt():
    # 7,5,4,3,3 on 2 bins: 7->0, 5->1, 4->1 (5<7), 3->0 (9>7? no: 7<9) ... loads end 10 / 12?
    x = np.array([3.0, 7.0, 4.0, 5.0, 3.0])
    r = post_balance(x, 2, method="lpt", max_swaps=0)
    # order 7,5,4,3,3: 7->b0; 5->b1; 4->b1 (5<7) =9; 3->b0 (7<9) =10; 3->b1 (9<10) =12
    assert r.dest.tolist() == [0, 0, 1, 1, 1] and sorted(r.loads.tolist()) == [10.0, 12.0]
    # the swap refinement finds 12/10 -> swap 4 (bin 1) with 3 (bin 0): 11/11
    assert post_balance(x, 2, method="lpt").loads.tolist() == [11.0, 11.0]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(5))
def test_every_method_honours_the_memory_cap(method, seed):
    """Heavy-tailed lengths and a cap 10% over the mean: no batch may hold more than the cap
    (methods that cannot build under a cap fall back to capped LPT and say so)."""
    rng = np.random.default_rng(seed)
    x = np.ceil(rng.pareto(1.2, 200) * 100 + 10)
    d = 8
    cap = max(x.max(), x.sum() / d * 1.1)
    r = post_balance(x, d, method=method, memory_cap=cap)
    assert np.bincount(r.dest, weights=x, minlength=d).max() <= cap + 1e-9
    assert r.dest.min() >= 0 and r.dest.max() < d and r.dest.size == x.size
    if r.method.startswith("lpt (") and method not in ("lpt", "auto", "best"):
        assert method in r.method  # the fallback names the method that broke the cap


def _improving_step(x: np.ndarray, dest: np.ndarray, d: int) -> tuple | None:
    """Brute force: a move or swap between the heaviest batch and any other that lowers the
    larger of their two loads, or None."""
    loads = np.bincount(dest, weights=x, minlength=d)
    a = int(loads.argmax())
    for b in range(d):
        gap = loads[a] - loads[b]
        if b == a or gap <= 0:
            continue
        for i in np.flatnonzero(dest == a):
            if 0 < x[i] < gap:
                return ("move", int(i), b)
            for j in np.flatnonzero(dest == b):
                if 0 < x[i] - x[j] < gap:
                    return ("swap", int(i), int(j))
    return None


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=40), d=st.integers(1, 9))
def test_auto_leaves_no_move_or_swap_that_lowers_the_heaviest_batch(lengths, d):
    """The refinement's promise, checked by brute force over every batch pair: no single move
    or swap lowers the heaviest batch unless it already sits at the mean (the old swap-only,
    lightest-only refinement stalled at 1.07-1.17 max/mean with four samples per rank)."""
    x = np.array(lengths, dtype=np.float64)
    r = post_balance(x, d, method="auto", tolerance=0.0, max_swaps=10_000)
    assert r.loads.max() <= x.sum() / d or _improving_step(x, r.dest, d) is None


@pytest.mark.parametrize("d", [8, 64])
@pytest.mark.parametrize("cost", ["tokens", "modeled"])
def test_auto_is_as_even_as_every_method_with_four_samples_per_rank(d, cost):
    """auto within 0.1 % of the most even of every method (issue 41: at 4 samples per rank it
    forced equal counts and fell 1-6 % behind), on the InternVL-shaped lengths."""
    from bench._internvl import synthetic_lengths

    worst = 0.0
    for seed in range(4):
        _, llm = synthetic_lengths(d * 4, seed=seed)
        x = llm.astype(np.float64)
        if cost == "modeled":
            x = 24.0 * 1536**2 * x + 2.0 * 1536 * x * x
        rivals = [post_balance(x, d, method=m).imbalance for m in ("lpt", "kk", "kk_equal", "best")]
        worst = max(worst, post_balance(x, d, method="auto").imbalance / min(rivals))
    assert worst <= 1.001


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=2, max_size=100),
    d=st.integers(2, 40),
    square=st.booleans(),
)
def test_auto_is_at_least_as_even_as_lpt_and_kk_on_small_steps(lengths, d, square):
    """On small steps (here at most 4,000 items x ranks), auto's plan is at least as even as
    refined LPT's and unequal KK's (each run on its own, the independent reference), or
    within its tolerance of the mean (where it stops by design: a heaviest batch 2e-5 above
    the mean is even enough; hypothesis found a step where KK's plan was 2.5e-6 more even
    than that). On such steps either rival can be the more even by a per cent or so (4
    samples per rank, modeled attention cost). Bug caught: auto that leaves unequal KK out (it
    stopped at LPT's or equal KK's plan, 1.007 where KK reaches 1.0056)."""
    x = np.array(lengths, dtype=np.float64)
    if square:  # attention-bound cost: a few items dominate
        x = 24.0 * 1536**2 * x + 2.0 * 1536 * x * x
    auto = post_balance(x, d, method="auto").loads.max()
    even_enough = x.sum() / d * (1.0 + 2e-5)  # post_balance's default tolerance
    for method in ("lpt", "kk"):
        assert auto <= max(post_balance(x, d, method=method).loads.max(), even_enough)


def test_auto_takes_unequal_kk_where_it_is_the_most_even():
    """32 token counts drawn from the InternVL statistics (ai2d + chartqa), 8 ranks, modeled
    cost of a 2B LLM: refined LPT and equal-count KK stop 3.8 % above unequal KK's plan; auto
    gives KK's (found among 800 such draws, where KK was the more even in 295). Sorted, so that
    the items' own batches (auto's third start: the heaviest ranks' items together) are no
    better; in the order drawn, that start ends 0.02 % under KK's."""
    tokens = [1364, 303, 1330, 332, 1320, 1325, 1320, 297, 1322, 1431, 1326, 1321, 1069, 1328,
              1324, 1318, 1322, 1415, 1317, 322, 1340, 1357, 327, 1334, 310, 304, 307, 1333,
              311, 411, 1318, 1448]  # fmt: skip
    n = np.array(sorted(tokens, reverse=True), dtype=np.float64)
    x = 24.0 * 1536**2 * 28 * n + 2.0 * 1536 * 28 * n * n
    kk = post_balance(x, 8, method="kk")
    assert kk.loads.max() < 0.97 * post_balance(x, 8, method="lpt").loads.max()
    auto = post_balance(x, 8, method="auto")
    assert auto.loads.max() == kk.loads.max() and auto.method == "kk"


@settings(max_examples=120, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 5000)), min_size=1, max_size=120),
    d=st.integers(1, 12),
    method=st.sampled_from(METHODS),
    slack=st.floats(1.0, 1.6),
    count_extra=st.one_of(st.none(), st.integers(0, 3)),
)
def test_two_constraints_at_once_for_every_method(pairs, d, method, slack, count_extra):
    """A memory cap on a quantity independent of the cost (an item's memory is not its
    length), for every method, ``auto`` included, with and without a count cap beside it:
    each item placed once, no rank over either cap, or a MemoryCapError naming the cap. The
    existing cap tests took memory = lengths, where the cheapest plan is also the most even."""
    x = np.array([p[0] for p in pairs], dtype=np.float64)
    mem = np.array([p[1] for p in pairs], dtype=np.float64)
    cap = max(mem.max(), mem.sum() / d) * slack
    max_count = None if count_extra is None else -(-x.size // d) + count_extra
    try:
        r = post_balance(x, d, method=method, memory=mem, memory_cap=cap, max_count=max_count)
    except MemoryCapError as exc:
        assert "memory cap" in str(exc)
        return
    except ValueError as exc:  # a method that takes no count cap says so
        assert max_count is not None and "max_count" in str(exc), str(exc)
        return
    assert r.dest.size == x.size and (r.dest.min() >= 0 and r.dest.max() < d)
    assert np.bincount(r.dest, weights=mem, minlength=d).max() <= cap * (1 + 1e-12)
    if max_count is not None:
        assert np.bincount(r.dest, minlength=d).max() <= max_count
    if r.method != "padded":  # padded's loads are count x longest
        assert np.allclose(r.loads, np.bincount(r.dest, weights=x, minlength=d))
