"""Placement kernels against their plain-Python twins and brute force, and ``best`` against its
candidates computed on their own.

Planted bugs these catch: node placement that weighs one phase only (a step without images, or
without text, then lands its heaviest groups on one node), the runtime locality and node
assignment kernels drifting from their twins, and ``method="best"`` keeping the worse plan."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing import _kernels as K
from balancing import _reference as R
from balancing.post_balance import post_balance
from balancing.steps import assign_steps

SEEDS = range(30)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("phases", [2, 3])
def test_place_on_nodes_equals_its_twin(seed, phases):
    """Vision and LLM; and an audio encoder beside them (three loads a group)."""
    rng = np.random.default_rng(seed)
    nodes, per_node, steps = int(rng.integers(1, 5)), int(rng.integers(1, 5)), 6
    d = nodes * per_node
    loads = rng.exponential(1.0, (steps, d, phases)).round(2)
    if seed % 3 == 0:
        loads[:, : d // 2, -1] = loads[:, : d // 2, 0]  # ties between groups
    node = np.empty((steps, d), dtype=np.int64)
    local = np.empty((steps, d), dtype=np.int64)
    K._nb_place_on_nodes(loads, nodes, per_node, node, local)
    ref_node, ref_local = R.place_on_nodes(loads.tolist(), nodes, per_node)
    assert node.tolist() == ref_node and local.tolist() == ref_local
    for s in range(steps):  # every (node, local rank) slot used once
        assert sorted(zip(node[s], local[s], strict=True)) == [
            (n, r) for n in range(nodes) for r in range(per_node)
        ]


def _best_split(loads, nodes, per_node):
    """The smallest heaviest-node load over every way to put the groups on the nodes."""
    best = np.inf
    for assign in itertools.product(range(nodes), repeat=len(loads)):
        if max(np.bincount(assign, minlength=nodes)) != per_node:
            continue
        best = min(best, np.bincount(assign, weights=loads, minlength=nodes).max())
    return best


@pytest.mark.parametrize("empty_phase", ["vision", "llm"])
@pytest.mark.parametrize("seed", range(25))
def test_a_step_with_one_phase_empty_is_placed_optimally(seed, empty_phase):
    """Two nodes of two ranks: with one phase empty (a text-only step has no vision load), the
    placement must still even the other phase, and for four groups the greedy is optimal
    (heaviest with lightest): checked against every placement."""
    rng = np.random.default_rng(seed)
    loads = rng.integers(1, 100, (1, 4)).astype(np.float64)
    zero = np.zeros_like(loads)
    lv, lt = (zero, loads) if empty_phase == "vision" else (loads, zero)
    node = np.empty((1, 4), dtype=np.int64)
    local = np.empty((1, 4), dtype=np.int64)
    K._nb_place_on_nodes(np.stack([lv, lt], axis=2), 2, 2, node, local)
    got = np.bincount(node[0], weights=loads[0], minlength=2).max()
    assert got == _best_split(loads[0], 2, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("exact", [False, True])
def test_local_first_equals_its_twin(seed, exact):
    """``exact``: small whole lengths and a whole target, so a rank often reaches the target
    exactly (an item that brings it there stays: at the target, not only below it)."""
    rng = np.random.default_rng(seed)
    nodes, per_node = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    d = nodes * per_node
    n = int(rng.integers(0, 40))
    x = rng.integers(1, 5 if exact else 300, n).astype(np.float64)
    src = rng.integers(0, d, n)
    order = K._nb_argsort_desc(x)
    target = x.sum() / d * float(rng.uniform(1.0, 1.3)) if n else 1.0
    if exact:
        target = float(np.ceil(target))
    dest = np.full(n, -1, dtype=np.int64)
    loads = K._nb_local_first(x, order, src, d, per_node, target, dest)
    ref_dest, ref_loads = R.local_first(
        x.tolist(), order.tolist(), src.tolist(), d, per_node, target
    )
    assert dest.tolist() == ref_dest
    assert loads.tolist() == pytest.approx(ref_loads)


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_node_assign_equals_its_twin(seed):
    rng = np.random.default_rng(seed)
    nodes, per_node = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    d = nodes * per_node
    benefit = rng.integers(0, 6, (d, nodes)).astype(np.float64)  # many ties
    out = np.empty(d, dtype=np.int64)
    assert K._nb_greedy_node_assign(benefit, per_node, out) == d
    assert out.tolist() == R.greedy_node_assign(benefit.tolist(), per_node)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=60),
    d=st.integers(1, 12),
)
def test_best_keeps_the_better_of_its_candidates(lengths, d):
    x = np.array(lengths, dtype=np.float64)
    candidates = [post_balance(x, d, method=m).loads.max() for m in ("lpt", "kk_equal")]
    assert post_balance(x, d, method="best").loads.max() == min(candidates)


@pytest.mark.parametrize(
    ("lengths", "winner"),
    [
        ([51, 27, 31, 5, 8, 2, 18, 81, 65], "lpt"),  # LPT 81 (optimal), equal counts 83
        # equal counts 131 (optimal: the sum is 521) against refined LPT's 142
        ([46, 22, 59, 46, 84, 70, 72, 57, 37, 28], "kk_equal"),
    ],
)
def test_best_wins_on_inputs_where_either_candidate_is_better(lengths, winner):
    x = np.array(lengths, dtype=np.float64)
    loads = {m: post_balance(x, 4, method=m).loads.max() for m in ("lpt", "kk_equal")}
    assert loads[winner] < max(loads.values())
    assert post_balance(x, 4, method="best").loads.max() == loads[winner]


def test_a_steps_node_placement_is_near_the_best_by_brute_force():
    """assign_steps places a step's groups on nodes by both phases' loads, each over its mean
    (vision patches and LLM tokens are on different scales). Anchor: the best placement by
    brute force over every assignment of 6 groups to 2 nodes of 3 ranks, objective the heaviest
    node in either phase (loads over their mean). Measured 2026-11-29: 0.034 above the best on
    average, 0.16 at worst; with LLM loads left in raw tokens (bug: the vision phase ignored),
    0.12 and 0.56."""
    import itertools

    from balancing.steps import assign_steps

    nodes, per = 2, 3
    d = nodes * per

    def heaviest(node, v, t):
        nv = np.bincount(node, v, nodes) / v.sum() * nodes
        nt = np.bincount(node, t, nodes) / t.sum() * nodes
        return max(nv.max(), nt.max())

    excess = []
    for seed in range(60):
        rng = np.random.default_rng(seed)
        v = rng.choice([0, 1, 2, 4, 5], d).astype(float) * 1024
        v[0] = max(v[0], 1024.0)
        t = rng.integers(200, 3000, d).astype(float)
        loads = {"vit_tokens": v, "llm_tokens": t, "vit_cost": v, "llm_cost": t}
        a = assign_steps(
            np.arange(d), d, loads, nodes=nodes, gpus_per_node=per, rng=np.random.default_rng(0)
        )
        best = min(heaviest(np.array(p) // per, v, t) for p in itertools.permutations(range(d)))
        excess.append(heaviest(a.node, v, t) - best)
    assert np.mean(excess) < 0.07 and max(excess) < 0.3, (np.mean(excess), max(excess))


@settings(max_examples=60, deadline=None)
@given(d=st.integers(2, 4), data=st.data())
def test_the_short_last_step_is_balanced_against_brute_force(d, data):
    """The groups left over after full steps are dissolved and their samples packed over the D
    ranks of the last step by LPT on each sample's weight (vision cost / its mean + LLM cost /
    its mean, the two phases alike): the heaviest rank of that step is within LPT's bound of
    the best split found by brute force, (4/3 - 1/(3D)) x optimum, and every sample is in it
    once. A last step packed on one phase only, or not packed, broke the bound unseen (the
    tests only counted its samples)."""
    n_full = data.draw(st.integers(0, 2))
    n_rest = data.draw(st.integers(1, d - 1))  # groups past the last full step
    n_groups = n_full * d + n_rest
    sizes = data.draw(st.lists(st.integers(1, 2), min_size=n_groups, max_size=n_groups))
    group_of = np.repeat(np.arange(n_groups), sizes)
    n = group_of.size
    vc = np.array(data.draw(st.lists(st.integers(0, 900), min_size=n, max_size=n)), float)
    lc = np.array(data.draw(st.lists(st.integers(1, 900), min_size=n, max_size=n)), float)
    loads = {"vit_tokens": vc, "llm_tokens": lc, "vit_cost": vc, "llm_cost": lc}
    a = assign_steps(
        group_of, n_groups, loads, nodes=1, gpus_per_node=d, rng=np.random.default_rng(0)
    )
    last = a.last_step_groups
    assert last.size == d and a.n_steps == n_full + 1
    members = np.flatnonzero(np.isin(a.group_of, last))
    w = vc / max(vc.mean(), 1e-12) + lc / max(lc.mean(), 1e-12)
    got = np.bincount(np.searchsorted(last, a.group_of[members]), w[members], d).max()
    best = min(
        np.bincount(np.array(split), w[members], d).max()
        for split in itertools.product(range(d), repeat=members.size)
    )
    assert got <= (4 / 3 - 1 / (3 * d)) * best + 1e-9, (got, best)
    # the full steps keep their groups whole; the last step's samples are the leftovers'
    assert members.size == n - sum(np.isin(group_of, np.flatnonzero(a.step[:n_groups] >= 0)))
