"""Ordering microbatches for a 1F1B pipeline: the timeline kernel against a longest-path
reference, the swap descent against its twin, Alg. 3 worked by hand, and the ordering's quality
against the best order found by brute force.

Bugs these catch: a timeline that lets an op start before its input arrives (or waits for the
wrong one); a makespan kernel or swap descent drifting from its reference; Alg. 3 filling the
stage-0 interval with the wrong microbatches (largest when none fits, one where p - 1 belong, the
wrong backward's arrival, no interval at all); and an ordering that is merely a permutation, not
a good one (the old tests passed with Alg. 3 replaced by the given order)."""

import itertools

import numpy as np
import pytest

from balancing import _reference as R
from balancing._kernels.schedule import (
    _nb_1f1b_ops,
    _nb_1f1b_times,
    _nb_makespan,
    _nb_swap_descent,
)
from balancing.reorder import inter_microbatch_reorder, mmscale_order, pipeline_times


def _times(rng, p, m):
    f = rng.lognormal(0.0, 0.7, (p, m))
    if rng.random() < 0.3:
        f[rng.random((p, m)) < 0.3] = 0.0  # zero-time ops: ties everywhere
    b = rng.lognormal(0.5, 0.5, (p, m)) if rng.random() < 0.5 else 2.0 * f
    return f, b


def _draw(seed: int, max_stages: int, max_mb: int):
    """(rng, forward, backward, order) of a random pipeline of up to the given sizes."""
    rng = np.random.default_rng(seed)
    p, m = int(rng.integers(1, max_stages + 1)), int(rng.integers(0, max_mb + 1))
    f, b = _times(rng, p, m)
    return rng, f, b, rng.permutation(m).astype(np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_1f1b_timeline_equals_a_longest_path_over_its_dependency_graph(seed):
    _, f, b, order = _draw(seed, 5, 9)
    got = _nb_1f1b_times(f, b, order)
    want = R.one_f_one_b_times(f.tolist(), b.tolist(), order.tolist())
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w
    ops = _nb_1f1b_ops(*f.shape)
    assert _nb_makespan(f, b, order, *ops) == max((x for r in want[3] for x in r), default=0.0)


@pytest.mark.parametrize("seed", range(30))
def test_swap_descent_equals_its_twin(seed):
    rng, f, b, order = _draw(seed, 4, 7)
    passes, evals = int(rng.integers(0, 4)), int(rng.integers(0, 60))
    got = _nb_swap_descent(f, b, order, passes, evals)
    assert got.tolist() == R.swap_descent(f.tolist(), b.tolist(), order.tolist(), passes, evals)


def test_pipeline_simulator_hand_worked():
    # 2 stages, 2 microbatches, forward 1, backward 2 everywhere:
    # stage0 F0 [0,1] F1 [1,2]; stage1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7];
    # stage0 B0 [4,6] B1 [7,9]
    t = pipeline_times(np.ones(2), p=2)
    assert t.start_f.tolist() == [[0, 1], [1, 4]]
    assert t.end_b.tolist() == [[6, 9], [4, 7]]
    assert t.makespan == 9
    assert np.isclose(t.bubble_fraction(np.ones((2, 2)), 2 * np.ones((2, 2))), 1 - 12 / 18)


def test_alg3_hand_worked():
    # p = 3; stages 1 and 2 take no time, so a backward reaches stage 0 as soon as stage 0 is
    # free after its forward; stage 0 runs 2 warm-up forwards, then F/B pairs. Forward costs
    # w = [1, 2, 3, 6, 7, 12, 5], backward 2w. First the smallest (0), last the p - 1 = 2 next
    # smallest (1, 2); pending, in the given order: 3, 4, 5, 6 (costs 6, 7, 12, 5).
    # Pick 1 (k = p - 1 = 2): timeline 0,3,4,5,6,1,2: F0 [0,1] F1 [1,7] F2 [7,14], B0 starts at
    #   14: interval 14 - 1 = 13. Largest fitting 13: 12 (5); then none fits the 1 left, so the
    #   smallest, 5 (6).
    # Pick 2 (k = 1): timeline 0,5,6,3,4,1,2: F0 [0,1] F1 [1,13] F2 [13,18] B0 [18,20]
    #   F3 [20,26]; B1 (the next backward, position 3 - (p - 1) = 1) starts at 26; stage 0 is busy
    #   until F2 ends at 18: interval 8: 7 (4) fits, 6 (3) is left.
    w = np.array([1.0, 2, 3, 6, 7, 12, 5])
    f = np.vstack([w, np.zeros((2, 7))])
    assert mmscale_order(f, 3).tolist() == [0, 5, 6, 4, 3, 1, 2]
    # l <= p: ascending
    assert mmscale_order(np.array([3.0, 1.0, 2.0]), 3).tolist() == [1, 2, 0]


def test_alg3_puts_smallest_first_and_last():
    w = np.array([5.0, 1.0, 9.0, 2.0, 7.0, 3.0, 8.0, 0.5])
    order = mmscale_order(np.vstack([w, np.full((2, 8), 4.0)]), 3)
    assert sorted(order.tolist()) == list(range(8))
    assert order[0] == 7  # the smallest first
    assert set(order[-2:].tolist()) == {1, 3}  # the p - 1 = 2 next smallest last


def _instance(seed, p, m, kind):
    enc = np.random.default_rng(seed).lognormal(0.0, 0.7, m)
    if kind == "encoder":  # stage 0 holds the vision encoder: the rest is even
        return np.vstack([enc, np.full((p - 1, m), enc.mean())])
    return np.vstack([enc] * p)  # every stage scales with the microbatch


def test_ordering_is_close_to_the_best_order_found_by_brute_force():
    # Measured (2026-11-29): Alg. 3 alone 9.2 % above the best order on average (28 % worst),
    # the given (random) order 13.7 % (54 %); Alg. 3 + swaps 0.65 % (5.9 % worst). Never above
    # the given order or Alg. 3's, by construction.
    excess = {"reorder": [], "alg3": [], "given": []}
    for (p, m), kind in itertools.product([(2, 5), (3, 3), (3, 6), (4, 7)], ["encoder", "all"]):
        for seed in range(25):
            f = _instance(seed, p, m, kind)

            def span(order, f=f):
                return pipeline_times(f, order=np.asarray(order)).makespan

            best = min(span(o) for o in itertools.permutations(range(m)))
            got = span(inter_microbatch_reorder(f, p))
            alg3, given = span(mmscale_order(f, p)), span(range(m))
            assert got <= min(alg3, given) + 1e-9
            for name, val in (("reorder", got), ("alg3", alg3), ("given", given)):
                excess[name].append(val / best - 1.0)
    mean = {k: float(np.mean(v)) for k, v in excess.items()}
    assert mean["reorder"] < 0.02, mean
    assert max(excess["reorder"]) < 0.10, mean
    assert mean["alg3"] < mean["given"] - 0.02, mean


def test_reordering_refuses_mismatched_backward_times():
    with pytest.raises(ValueError, match="bwd has shape"):
        inter_microbatch_reorder(np.ones(6), 2, bwd=np.ones(4))
    with pytest.raises(ValueError, match="max_work must be"):
        inter_microbatch_reorder(np.ones(6), 2, max_work=-1)


def test_reordering_stops_at_its_work_budget():
    f = _instance(3, 4, 12, "all")
    free = inter_microbatch_reorder(f, 4)
    none = inter_microbatch_reorder(f, 4, max_work=0)
    assert none.tolist() == mmscale_order(f, 4).tolist() or none.tolist() == list(range(12))
    assert pipeline_times(f, order=free).makespan <= pipeline_times(f, order=none).makespan
