"""Node-wise rearrangement and pipeline reordering."""

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from balancing.nodewise import (
    inter_node_volume,
    locality_balance,
    nodewise_permutation,
    volume_matrix,
)
from balancing.post_balance import post_balance
from balancing.reorder import intra_batch_reorder


def _brute_force_best_max(v, per_node):
    d = v.shape[0]
    best = np.inf
    for perm in itertools.permutations(range(d)):
        best = min(best, inter_node_volume(v, np.array(perm), per_node)[1])
    return best


def test_milp_is_optimal_on_small_layouts():
    rng = np.random.default_rng(0)
    for _ in range(5):
        d, c = 6, 3
        src = rng.integers(0, d, 60)
        x = rng.integers(1, 100, 60).astype(float)
        dest = post_balance(x, d, method="lpt").dest
        r = nodewise_permutation(src, dest, x, d, c)
        assert r.method.startswith("milp")
        assert np.isclose(
            r.max_rank_inter_node, _brute_force_best_max(volume_matrix(src, dest, x, d), c)
        )
        assert sorted(r.rank_of_batch.tolist()) == list(range(d))


@pytest.mark.parametrize("scale", [1.0, 1e6, 1e11])
def test_milp_is_optimal_at_every_volume_scale(scale):
    """Volumes in bytes of squared token costs reach 1e11 and more: there HiGHS called the
    MILP infeasible (a feasible assignment problem) and a training step raised RuntimeError
    (found by hypothesis in CI: 17 samples, 4 nodes of one rank). The volumes are scaled
    before solving: the MILP answers at every scale, with the brute force's optimum."""
    rng = np.random.default_rng(3)
    for d, c in ((4, 1), (6, 3), (6, 2)):
        src = rng.integers(0, d, 40)
        x = rng.integers(1, 5000, 40).astype(float)
        x = scale * (x + x * x / 4096)
        dest = post_balance(x, d, method="lpt").dest
        r = nodewise_permutation(src, dest, x, d, c)
        assert r.method.startswith("milp"), (d, c, r.method)
        best = _brute_force_best_max(volume_matrix(src, dest, x, d), c)
        assert np.isclose(r.max_rank_inter_node, best, rtol=1e-9), (d, c)


def test_a_milp_without_an_answer_falls_back_to_greedy(monkeypatch):
    """A MILP that gives no assignment in its time limit (a loaded machine) is not a failed
    step: the greedy assignment the many-rank case uses takes over, a valid permutation never
    worse than the identity's largest inter-node volume."""
    import types

    import scipy.optimize

    monkeypatch.setattr(
        scipy.optimize, "milp", lambda *a, **k: types.SimpleNamespace(x=None, message="time limit")
    )
    rng = np.random.default_rng(5)
    src = rng.integers(0, 6, 60)
    x = rng.integers(1, 100, 60).astype(float)
    dest = post_balance(x, 6, method="lpt").dest
    r = nodewise_permutation(src, dest, x, 6, 3)
    assert r.method.startswith("greedy")
    assert sorted(r.rank_of_batch.tolist()) == list(range(6))
    assert r.max_rank_inter_node <= r.max_rank_inter_node_identity + 1e-9


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), nodes=st.integers(2, 6), per=st.integers(1, 4))
def test_greedy_permutation_never_worse_than_identity(seed, nodes, per):
    rng = np.random.default_rng(seed)
    d = nodes * per
    src = rng.integers(0, d, 10 * d)
    x = rng.integers(1, 1000, src.size).astype(float)
    dest = post_balance(x, d).dest
    r = nodewise_permutation(src, dest, x, d, per, exact_max_d=0)
    assert r.max_rank_inter_node <= r.max_rank_inter_node_identity
    assert sorted(r.rank_of_batch.tolist()) == list(range(d))


def test_locality_balance_keeps_traffic_inside_nodes():
    rng = np.random.default_rng(3)
    d, per = 4, 2  # 2 nodes x 2 ranks
    src = np.repeat(np.arange(d), 30)
    x = rng.integers(100, 2000, src.size).astype(float)
    x[src == 0] *= 1.5  # one overloaded rank
    lpt = post_balance(x, d, method="lpt")
    local = locality_balance(x, src, d, per)
    lpt_inter = inter_node_volume(volume_matrix(src, lpt.dest, x, d), np.arange(d), per)[0]
    local_inter = inter_node_volume(volume_matrix(src, local.dest, x, d), np.arange(d), per)[0]
    assert local_inter < 0.5 * lpt_inter
    assert local.imbalance <= 1.001


@settings(max_examples=150, deadline=None)
@example(  # found in CI: the MILP on unscaled volumes of ~1e11 called itself infeasible
    lengths=[1, 332, 2080, 4095, 1, 117, 2, 3684, 4135, 2136, 73, 2, 26, 69, 276, 52, 170],
    nodes=4,
    per=1,
    seed=0,
    square=True,
)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=80),
    nodes=st.integers(1, 4),
    per=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    square=st.booleans(),
)
def test_locality_balance_within_max_loss_of_post_balance(lengths, nodes, per, seed, square):
    """locality_balance's heaviest rank is never more than ``max_loss`` above post_balance's
    (the reference: post_balance run alone on the same items), its plan a valid one of ranks
    whose loads it reports. Bug caught: a locality plan stuck at a local optimum 1-3 % above
    post_balance's at 4 samples per rank (issue 41), kept as it was."""
    d = nodes * per
    x = np.array(lengths, dtype=np.float64)
    if square:
        x = 24.0 * 1536**2 * x + 2.0 * 1536 * x * x
    src = np.random.default_rng(seed).integers(0, d, x.size)
    r = locality_balance(x, src, d, per)
    assert r.dest.shape == x.shape and ((r.dest >= 0) & (r.dest < d)).all()
    assert np.allclose(r.loads, np.bincount(r.dest, weights=x, minlength=d))
    assert r.loads.max() <= post_balance(x, d).loads.max() * 1.005 * (1 + 1e-12)


@pytest.mark.parametrize("d", [16, 32])
def test_locality_balance_within_max_loss_on_vlm_lengths(d):
    """The same bound on VLM-shaped lengths at 4 samples per rank, where the locality plan's
    own local optimum lands above it on some draws (seeds 1 and 2 at d = 16, 6 at d = 32:
    0.56-0.61 % above post_balance's): those take the fallback, the rest keep their plan."""
    from bench._internvl import synthetic_lengths

    methods = set()
    for seed in range(8):
        _, llm = synthetic_lengths(d * 4, seed=seed)
        x = llm.astype(np.float64)
        r = locality_balance(x, np.repeat(np.arange(d), 4), d, 8)
        assert r.loads.max() <= post_balance(x, d).loads.max() * 1.005, (seed, r.method)
        methods.add(r.method)
    assert "locality" in methods and len(methods) > 1


def test_locality_balance_keeps_its_own_plan_where_it_is_even():
    """At 16 samples per rank the locality plan is within max_loss of the mean: kept (most
    samples stay on their rank), not replaced by post_balance's mixed batches."""
    rng = np.random.default_rng(4)
    d, per = 16, 4
    src = np.repeat(np.arange(d), 16)
    x = rng.integers(300, 4000, src.size).astype(float)
    r = locality_balance(x, src, d, per)
    assert r.method == "locality" and r.imbalance <= 1.005
    assert (r.dest == src).mean() > 0.5


def test_intra_batch_reorder_hand_worked():
    # ascending 1,2,3,4,5 onto 2 groups by least load: 1->g0, 2->g1, 3->g0 (1<2), 4->g1, 5->g0
    order, group = intra_batch_reorder(np.array([5, 1, 4, 2, 3]), 2)
    assert group.tolist() == [0, 0, 1, 1, 0]
    assert order.tolist() == [1, 4, 0, 3, 2]
