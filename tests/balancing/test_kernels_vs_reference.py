"""Every numba kernel agrees exactly with its plain-Python reference, over many seeds."""

import numpy as np
import pytest

from balancing import _kernels as K
from balancing import _reference as R

SEEDS = range(40)


def _lengths(rng, n, heavy):
    if heavy:
        return np.round(np.exp(rng.normal(6.0, 1.2, n)))
    return rng.integers(1, 500, n).astype(np.float64)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [0, 1, 2, 40])
def test_isf_round_at_its_caps(seed, n):
    """Loads that sum exactly to each cap and each keep threshold (a sample that brings a group
    to the cap joins it; one past it starts the next), and samples over a cap alone (a group of
    their own, never an empty group before them); no sample, no group."""
    rng = np.random.default_rng(seed)
    qv, qt, qfv, qft = 4096, 3000, 3072, 2000
    v = rng.choice([0, 1024, 2048, 3072, 4096, 5120], n).astype(np.int64)
    t = rng.choice([500, 1000, 1500, 2000, 3000, 3500], n).astype(np.int64)
    ends = np.empty(max(n, 1), dtype=np.int64)
    kept = np.empty(max(n, 1), dtype=np.bool_)
    loads, q, qf = np.stack([v, t], axis=1), np.array([qv, qt]), np.array([qfv, qft])
    g = K._nb_isf_round(loads, q, qf, ends, kept)
    ref_ends, ref_kept = R.isf_round(loads.tolist(), q.tolist(), qf.tolist())
    assert ends[:g].tolist() == ref_ends and kept[:g].tolist() == ref_kept
    assert all(b > a for a, b in zip([0, *ref_ends], ref_ends, strict=False))  # none empty


def _phase_loads(rng, n, phases):
    """(n, phases) loads: vision in tiles of 1024, then audio-like encoder phases (zero for
    most samples, 750 or a Omni-like count for the others), the LLM last."""
    cols = [rng.integers(0, 6, n) * 1024]
    for _ in range(phases - 2):
        cols.append(np.where(rng.random(n) < 0.4, rng.choice([750, 1500, 3000], n), 0))
    cols.append(rng.integers(50, 2000, n))
    return np.stack(cols, axis=1).astype(np.int64)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("phases", [2, 3, 4])
def test_isf_round(seed, phases):
    """Two phases (vision, LLM) as before any other encoder existed; three and four (an audio
    encoder and another between them): a group closes at any phase's cap and is kept at any
    phase's target."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    loads = _phase_loads(rng, n, phases)
    order = rng.permutation(n)
    q = np.array([16 * 1024] + [6000] * (phases - 2) + [5000])
    qf = np.array([15 * 1024] + [5200] * (phases - 2) + [4800])
    ends = np.empty(n, dtype=np.int64)
    kept = np.empty(n, dtype=np.bool_)
    g = K._nb_isf_round(loads[order], q, qf, ends, kept)
    ref_ends, ref_kept = R.isf_round(loads[order].tolist(), q.tolist(), qf.tolist())
    assert ends[:g].tolist() == ref_ends and kept[:g].tolist() == ref_kept
    # the round's outcome: kept groups numbered from 7, the rest copied with their loads
    group_of = np.full(n, -1, dtype=np.int64)
    ri, rl = np.empty(n, dtype=np.int64), np.empty((n, phases), dtype=np.int64)
    nk, nr = K._nb_apply_round(order, loads[order], ends, kept, g, 7, group_of, ri, rl)
    ref_groups, ref_rest = R.apply_round(order.tolist(), ref_ends, ref_kept, 7)
    assert nk == sum(ref_kept) and ri[:nr].tolist() == ref_rest
    assert rl[:nr].tolist() == loads[ref_rest].tolist()
    assert {i: int(group_of[i]) for i in np.flatnonzero(group_of >= 0)} == ref_groups
    # in place, as isf_group runs it (the rest moved to the front of the same arrays)
    oi, lo, again = order.copy(), loads[order].copy(), np.full(n, -1, dtype=np.int64)
    assert K._nb_apply_round(oi, lo, ends, kept, g, 7, again, oi, lo) == (nk, nr)
    assert oi[:nr].tolist() == ref_rest and lo[:nr].tolist() == loads[ref_rest].tolist()
    assert again.tolist() == group_of.tolist()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["mixed", "all images", "zero loads", "ties", "wide window"])
def test_best_fit(seed, kind):
    """``mixed``: some samples without images (the smallest vision load 0: only the text side
    can close a group early); ``all images``: every sample has one, so a group too full in
    vision for the smallest sample closes early too; ``zero loads``: samples with no load in
    either phase (a slack of exactly 2) join an open group; ``ties``: open groups of equal
    sums (the earliest opened wins); ``wide window``: more open groups than the small
    integers Python keeps once (a window compared by identity never closes one)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200)) if kind != "wide window" else 700
    v = rng.integers(0 if kind == "mixed" else 1, 6, n) * 1024
    t = rng.integers(50, 2000, n)
    if kind == "zero loads":
        zero = rng.random(n) < 0.3
        v[zero], t[zero] = 0, 0
    if kind == "ties":
        v, t = rng.choice([1024, 2048], n), rng.choice([1000, 2000], n)
    if kind == "wide window":  # no two big samples share a group, none fills one: all stay open
        v = np.full(n, 10_000)
        t = np.full(n, 100)
        v[0], t[0] = 1, 1
    order = rng.permutation(n)
    window = int(rng.integers(1, 10)) if kind != "wide window" else 300
    out = np.full(n, -1, dtype=np.int64)
    loads, q = np.stack([v, t], axis=1), np.array([16 * 1024, 5000])
    K._nb_best_fit(order, loads, q, window, out)
    ref = R.best_fit(order.tolist(), loads.tolist(), q.tolist(), window)
    assert {i: int(out[i]) for i in order} == ref


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("phases", [3, 4])
def test_best_fit_more_phases(seed, phases):
    """Three and four phases: a sample joins only a group it fits in every phase, the slack
    summed over all of them; a group closes when any phase cannot take that phase's smallest
    load (most samples have no audio: the smallest audio load is 0)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    loads = _phase_loads(rng, n, phases)
    order = rng.permutation(n)
    q = np.array([16 * 1024] + [4500] * (phases - 2) + [5000])
    window = int(rng.integers(1, 10))
    out = np.full(n, -1, dtype=np.int64)
    K._nb_best_fit(order, loads, q, window, out)
    ref = R.best_fit(order.tolist(), loads.tolist(), q.tolist(), window)
    assert {i: int(out[i]) for i in order} == ref


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("heavy", [False, True])
def test_argsort_and_lpt(seed, heavy):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 400)), int(rng.integers(1, 40))
    x = _lengths(rng, n, heavy)
    order = K._nb_argsort_desc(x)
    assert order.tolist() == R.argsort_desc(x.tolist())
    out = np.empty(n, dtype=np.int64)
    K._nb_lpt(x, order, d, out)
    assert dict(enumerate(out.tolist())) == R.lpt(x.tolist(), order.tolist(), d)
    capped = np.empty(n, dtype=np.int64)
    assert K._nb_lpt_capped(x, order, d, 0, 0.0, x, capped) == -1
    assert (capped == out).all()


@pytest.mark.parametrize("d", [255, 256, 257])
def test_lpt_and_refine_with_more_ranks_than_small_integers(d):
    """Past 256 ranks (heap slots beyond the integers Python keeps once: a slot compared by
    identity instead of value breaks only there), LPT, capped LPT and refinement equal their
    references."""
    rng = np.random.default_rng(d)
    n = 3 * d + 7
    x = _lengths(rng, n, True)
    order = K._nb_argsort_desc(x)
    out = np.empty(n, dtype=np.int64)
    K._nb_lpt(x, order, d, out)
    assert dict(enumerate(out.tolist())) == R.lpt(x.tolist(), order.tolist(), d)
    capped = np.full(n, -1, dtype=np.int64)
    max_count = int(np.ceil(n / d))
    bad = K._nb_lpt_capped(x, order, d, max_count, 0.0, x, capped)
    ref, ref_bad = R.lpt_capped(x.tolist(), order.tolist(), d, max_count, 0.0, x.tolist())
    assert bad == ref_bad == -1 and dict(enumerate(capped.tolist())) == ref
    kk = np.empty(n, dtype=np.int64)  # its merge heap holds n partitions
    K._nb_karmarkar_karp(x, order, d, False, kk)
    assert dict(enumerate(kk.tolist())) == R.karmarkar_karp(x.tolist(), order.tolist(), d, False)
    bins = rng.integers(0, d, n)
    got = bins.copy()
    target = x.sum() / d
    loads = K._nb_refine(x, order, got, d, target, 4 * d, 0.0, x, 0, True)
    ref_bins, ref_loads = R.refine(
        x.tolist(), order.tolist(), bins.tolist(), d, target, 4 * d, 0.0, x.tolist(), 0, True
    )
    assert got.tolist() == ref_bins
    np.testing.assert_array_equal(loads, ref_loads)


@pytest.mark.parametrize("seed", SEEDS)
def test_lpt_with_count_and_memory_caps(seed):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 200)), int(rng.integers(1, 20))
    x = _lengths(rng, n, True)
    mem = rng.integers(1, 100, n).astype(np.float64)
    order = K._nb_argsort_desc(x)
    max_count = int(np.ceil(n / d)) + int(rng.integers(0, 2))
    cap = float(mem.sum() / d * rng.uniform(1.0, 1.5))
    out = np.full(n, -1, dtype=np.int64)
    bad = K._nb_lpt_capped(x, order, d, max_count, cap, mem, out)
    ref, ref_bad = R.lpt_capped(x.tolist(), order.tolist(), d, max_count, cap, mem.tolist())
    assert bad == ref_bad
    placed = order[: bad if bad >= 0 else n]
    assert {int(i): int(out[i]) for i in placed} == ref


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("equal", [False, True])
def test_karmarkar_karp(seed, equal):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 120)), int(rng.integers(1, 12))
    x = _lengths(rng, n, seed % 2 == 0)
    order = K._nb_argsort_desc(x)
    out = np.empty(n, dtype=np.int64)
    K._nb_karmarkar_karp(x, order, d, equal, out)
    assert dict(enumerate(out.tolist())) == R.karmarkar_karp(x.tolist(), order.tolist(), d, equal)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("equal", [False, True])
def test_karmarkar_karp_in_an_order_that_is_not_heaviest_first(seed, equal):
    """The kernel skips sorting a starting solution that is already heaviest first (what a
    descending ``order`` gives, ties included); one that is not is sorted as the reference sorts
    it: an order that is not descending (any permutation) gives the reference's partition."""
    rng = np.random.default_rng(1000 + seed)
    n, d = int(rng.integers(2, 60)), int(rng.integers(2, 9))
    x = rng.integers(1, 50, n).astype(np.float64)
    x[rng.integers(0, n)] = 0.0  # an empty item among the others (a tie with the padding)
    order = rng.permutation(n).astype(np.int64)
    out = np.empty(n, dtype=np.int64)
    K._nb_karmarkar_karp(x, order, d, equal, out)
    assert dict(enumerate(out.tolist())) == R.karmarkar_karp(x.tolist(), order.tolist(), d, equal)


@pytest.mark.parametrize("d", [1, 2, K.INSERTION_MAX - 1, K.INSERTION_MAX, K.INSERTION_MAX + 1, 64])
def test_order_desc_is_a_stable_descending_argsort(d):
    """Karmarkar-Karp's merge order, by insertion up to ``INSERTION_MAX`` values and by numpy
    above: numpy's stable argsort of the negated values (ties by index), at the limit, one
    below and one above, with many ties and with zeros (an empty subset's sum)."""
    rng = np.random.default_rng(d)
    for _ in range(20):
        v = rng.integers(0, 4, d).astype(np.float64)
        o = np.empty(d, dtype=np.int64)
        K._order_desc(v, o)
        assert o.tolist() == np.argsort(-v, kind="stable").tolist(), v


def test_descending_is_non_increasing_and_refuses_nan():
    assert K._descending(np.array([3.0, 3.0, 2.0, 0.0]))
    assert K._descending(np.array([1.0])) and K._descending(np.empty(0))
    assert not K._descending(np.array([3.0, 2.0, 2.5]))
    assert not K._descending(np.array([0.0, 1.0]))
    assert not K._descending(np.array([3.0, np.nan, 1.0]))


@pytest.mark.parametrize("seed", SEEDS)
def test_padded_batches(seed):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 300)), int(rng.integers(1, 30))
    x = np.sort(_lengths(rng, n, seed % 2 == 0))
    out = np.empty(n, dtype=np.int64)
    bound = K._nb_padded_batches(x, d, out)
    ref_bound, ref = R.padded_batches(x.tolist(), d)
    assert bound == ref_bound and out.tolist() == ref and out.max() < d


@pytest.mark.parametrize("seed", SEEDS)
def test_group_and_block_stats(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    v = (rng.integers(0, 6, n) * 1024).astype(np.float64)
    t = rng.integers(1, 3000, n).astype(np.float64)
    vc, tc = rng.random(n) * 1e3, rng.random(n) * 1e3
    n_groups = int(rng.integers(1, n + 2))  # some groups stay empty
    ids = rng.integers(0, n_groups, n)
    got = K._nb_group_stats(ids, v, t, vc, tc, n_groups)
    np.testing.assert_array_equal(got, R.group_stats(ids, v, t, vc, tc, n_groups))
    assert K._nb_stats_pad_ratios(got) == R.stats_pad_ratios(got.tolist())
    perm, b = rng.permutation(n), int(rng.integers(1, 9))
    got = K._nb_block_stats(perm, b, v, t, vc, tc)
    np.testing.assert_array_equal(got, R.block_stats(perm, b, v, t, vc, tc))


@pytest.mark.parametrize("seed", SEEDS)
def test_sample_costs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 200))
    seq_lens = [rng.integers(1, 3000, int(rng.integers(0, 4))).tolist() for _ in range(n)]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seq_lens])]).astype(np.int32)
    values = np.array([x for s in seq_lens for x in s], dtype=np.int32)
    vit = np.array([sum(s) for s in seq_lens], dtype=np.int64)
    llm = rng.integers(1, 9000, n)
    coef = rng.random(6) * [1.0, 1e-3, 50.0, 1.0, 1e-4, 30.0]
    vc, tc = K._nb_sample_costs(vit, llm, values, offsets, *coef)
    ref_vc, ref_tc = R.sample_costs(vit.tolist(), llm.tolist(), seq_lens, *coef)
    np.testing.assert_array_equal(vc, ref_vc)
    np.testing.assert_array_equal(tc, ref_tc)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("caps", ["none", "count", "memory"])
def test_refine(seed, caps):
    """Moves and swaps, the tree's choice of partner past the lightest bin, and the walk under a
    cap: the same loads and the same lengths in every bin as the brute-force reference."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 9))
    n = int(rng.integers(1, 6 * d + 2))
    x = _lengths(rng, n, heavy=seed % 2 == 0)
    mem = x.copy()
    cap, max_count = 0.0, 0
    if caps == "memory":  # distinct memories, so which of two equal lengths moves is one answer
        x = x + rng.random(n)
        mem = rng.integers(1, 100, n) + rng.random(n)
        cap = float(mem.sum() / d * 1.3 + mem.max())
    bins = rng.integers(0, d, n)
    if caps == "count":
        max_count = int(np.bincount(bins, minlength=d).max()) + int(rng.integers(0, 2))
    order = K._nb_argsort_desc(x)
    target = x.sum() / d * (1.0 + [0.0, 1e-3, 0.05][seed % 3])
    moves = seed % 4 != 1
    got = bins.copy()
    loads = K._nb_refine(x, order, got, d, target, 4 * d, cap, mem, max_count, moves)
    ref_bins, ref_loads = R.refine(
        x.tolist(),
        order.tolist(),
        bins.tolist(),
        d,
        target,
        4 * d,
        cap,
        mem.tolist(),
        max_count,
        moves,
    )
    assert loads.tolist() == ref_loads
    for b in range(d):
        assert sorted(x[got == b].tolist()) == sorted(x[np.array(ref_bins) == b].tolist())
    if not moves:
        assert (np.bincount(got, minlength=d) == np.bincount(bins, minlength=d)).all()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("heavy", [False, True])
def test_lpt_quadratic(seed, heavy):
    """OrchMLLM Alg. 4 (the ``quadratic`` post-balancing method)."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 300)), int(rng.integers(1, 24))
    x = _lengths(rng, n, heavy)
    order = K._nb_argsort_desc(x)
    tol = float(x.sum() / d * rng.choice([0.0, 0.01, 0.05, 0.3]))
    out = np.empty(n, dtype=np.int64)
    K._nb_lpt_quadratic(x, order, d, tol, out)
    assert dict(enumerate(out.tolist())) == R.lpt_quadratic(x.tolist(), order.tolist(), d, tol)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("heavy", [False, True])
def test_padded_attention(seed, heavy):
    """OrchMLLM Alg. 5 (the ``padded_attention`` post-balancing method), with the bound it is
    given in use (LPT's largest sum) and tighter or looser ones."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 300)), int(rng.integers(1, 24))
    x = _lengths(rng, n, heavy)
    order = K._nb_argsort_desc(x)
    probe = np.empty(n, dtype=np.int64)
    bound = float(K._nb_lpt(x, order, d, probe).max() * rng.choice([0.5, 1.0, 1.5]))
    out = np.empty(n, dtype=np.int64)
    K._nb_padded_attention(x, order, d, bound, out)
    assert dict(enumerate(out.tolist())) == R.padded_attention(x.tolist(), order.tolist(), d, bound)


@pytest.mark.parametrize("seed", SEEDS)
def test_lazy_heap_walk_visits_bins_in_ascending_load_order(seed):
    """Under a cap, refinement walks the bins lightest first without popping the min-heap
    (``refine._walk_next``). Reference: the bins sorted by (load, bin). Ties are common (loads
    from a handful of values). Planted bugs this catches: the walk's own heap sifting to the
    wrong child, or a child slot never pushed (the kernel then tried a heavier bin first, or
    skipped one, which the end-to-end comparison above rarely sees)."""
    from balancing._kernels.heap import _ih_heapify, _ih_init
    from balancing._kernels.refine import _walk_next

    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 60))
    loads = rng.integers(0, 6, d).astype(np.float64)
    keys, vals, pos = _ih_init(d)
    keys[:] = loads
    _ih_heapify(keys, vals, pos, d)
    before = (keys.copy(), vals.copy(), pos.copy())
    walk = np.empty(d + 1, dtype=np.int64)
    walk[0], m, seen = 0, 1, []
    while m > 0:
        s, m = _walk_next(walk, m, keys, vals, d)
        seen.append(int(vals[s]))
    assert seen == sorted(range(d), key=lambda b: (loads[b], b))
    for a, b in zip(before, (keys, vals, pos), strict=True):  # the heap itself is untouched
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_min_tree_prefix_query_equals_brute_force(seed):
    """The tree that finds a partner past the lightest bin (``refine._tree_set``,
    ``_tree_prefix_min``): after every update, each prefix's least value and its lowest leaf
    among ties equal numpy's over the same leaves. Planted bugs this catches: a tie broken to
    a higher leaf, or a larger value taken for a lower leaf index (another partner chosen than
    the rule's)."""
    from balancing._kernels.refine import _tree_prefix_min, _tree_set

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 70))
    size = 1
    while size < n:
        size *= 2
    tv = np.full(2 * size, np.inf)
    ti = np.zeros(2 * size, dtype=np.int64)
    ti[size:] = np.arange(size)
    for j in range(size - 1, 0, -1):  # an empty tree: each node names its leftmost leaf
        ti[j] = ti[2 * j]
    leaves = np.full(size, np.inf)
    updates = [(p, float(rng.integers(0, 8))) for p in range(n)]
    updates += [(int(rng.integers(0, n)), float(rng.integers(0, 8))) for _ in range(2 * n)]
    for p, v in updates:
        _tree_set(tv, ti, size, p, v)
        leaves[p] = v
        for q in range(n + 1):
            best, leaf = _tree_prefix_min(tv, ti, size, q)
            want = leaves[:q].min() if q else np.inf
            want_leaf = int(np.flatnonzero(leaves[:q] == want)[0]) if q and want < np.inf else -1
            assert (best, leaf) == (want, want_leaf), (q, leaves[:q])
