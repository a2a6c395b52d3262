"""OmniBal balanced partitioning and the fixed-shape microbatch plan."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_adapter.train.partition import (
    anchor_partition,
    layer_count_partition,
    partition_candidates,
    profile_layers,
    score_partition,
    search_partition,
    stage_ranges,
)
from trainer_adapter.train.pipeline import doc_rows, pack_rows, plan_microbatches


def test_paper_example_candidate_count():
    # OmniBal §4.2: r = 1, N = 4 gives 3 x 3 x 3 = 27 candidates around the anchor
    assert len(partition_candidates((5, 10, 15), 1, 20)) == 27


def test_anchor_balances_heterogeneous_layers():
    # 6 heavy ViT-like layers, then 12 light LLM layers: a layer-count split is uneven
    times = [3.0] * 6 + [1.0] * 12
    a = anchor_partition(times, 3)
    sa = score_partition(times, [0] * 18, a)
    sc = score_partition(times, [0] * 18, layer_count_partition(18, 3))
    assert sa.stage_times == (9.0, 11.0, 10.0)
    assert sc.stage_times == (18.0, 6.0, 6.0)
    assert sa.variance < sc.variance


def test_score_is_variance_plus_communication():
    p = score_partition([1, 2, 3, 4], [10, 20, 30, 40], (2,), comm_weight=0.5)
    assert p.stage_times == (3.0, 7.0)
    assert p.variance == pytest.approx(8.0)  # (3-5)^2 + (7-5)^2
    assert p.comm == 20.0  # the activation of layer 1, the last before the cut
    assert p.score == pytest.approx(8.0 + 10.0)


def test_search_uses_the_trial_to_pick():
    times = [1.0] * 8
    best, ranked = search_partition(
        times, [1.0] * 8, 2, radius=2, top_k=3, comm_weight=0.0, trial=lambda b: abs(b[0] - 3)
    )
    assert len(ranked) == 3 and best.trial_seconds == min(p.trial_seconds for p in ranked)
    no_trial, _ = search_partition(times, [1.0] * 8, 2, radius=2, comm_weight=0.0)
    assert no_trial.bounds == (4,)


def test_profile_excludes_the_warm_up_and_takes_the_median():
    """Bugs: the first call (compilation, allocation) timed as a layer's cost; one slow run (a
    GC pause, another process) taken as it. Each layer runs once untimed, then ``repeats``
    times; its time is the median."""
    calls = []

    def layer(delays):
        def fn():
            calls.append(fn)
            time.sleep(delays[min(calls.count(fn), len(delays)) - 1])

        return fn

    slow_first = layer([0.3, 0.002, 0.002, 0.002])
    one_outlier = layer([0.002, 0.002, 0.002, 0.3])
    out = profile_layers([slow_first, one_outlier], repeats=3)
    assert calls.count(slow_first) == calls.count(one_outlier) == 4
    assert (out < 0.1).all(), out


def test_partition_refuses_times_that_are_not_numbers():
    with pytest.raises(ValueError, match="finite"):
        search_partition([1.0, float("nan"), 1.0], [1.0] * 3, 2)
    with pytest.raises(ValueError, match="finite"):
        search_partition([1.0] * 3, [1.0, float("inf"), 1.0], 2)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.01, 10.0), min_size=2, max_size=30),
    st.integers(1, 6),
    st.integers(0, 2),
)
def test_partitions_cover_every_layer_once(times, n, r):
    n = min(n, len(times))
    best, ranked = search_partition(times, [1.0] * len(times), n, radius=r, top_k=2)
    for p in ranked:
        rng = stage_ranges(p.bounds, len(times))
        assert rng[0][0] == 0 and rng[-1][1] == len(times)
        assert all(lo < hi for lo, hi in rng) and all(
            a[1] == b[0] for a, b in itertools.pairwise(rng)
        )
    assert best.score <= min(p.score for p in ranked) + 1e-12


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=0, max_size=25), st.integers(1, 4), st.integers(1, 3))
def test_microbatch_plan_is_a_partition_under_the_cap(lengths, n_mb, pp):
    lens = np.array(lengths)
    cap = max(int(lens.max(initial=1)), int(np.ceil(1.5 * lens.sum() / n_mb)) + 50)
    plan = plan_microbatches(lens, n_mb, cap, pp)
    flat = sorted(i for row in plan.rows for i in row)
    assert flat == list(range(len(lengths)))
    assert all(lens[list(row)].sum() <= cap for row in plan.rows)
    assert len(plan.rows) == n_mb


def test_pack_rows_round_trip():
    lens = np.array([3, 2, 4])
    cu = np.concatenate([[0], np.cumsum(lens)])
    x = torch.arange(9.0)[:, None]
    plan = plan_microbatches(lens, 2, 6, 1)
    rows = pack_rows(x, cu, plan, 6, -1.0)
    docs = doc_rows(plan, lens, 6)
    for k, row in enumerate(plan.rows):
        want = torch.cat([x[cu[i] : cu[i + 1]] for i in row])
        assert torch.equal(rows[k, : len(want)], want)
        assert (rows[k, len(want) :] == -1).all() and (docs[k, len(want) :] == -1).all()


def test_microbatch_plan_overflow_is_a_clear_error():
    with pytest.raises(ValueError, match="raise mb_tokens"):
        plan_microbatches(np.array([10, 10, 10]), 2, 12, 2)


@pytest.mark.parametrize("seed", range(40))
def test_search_over_every_partition_finds_the_brute_force_optimum(seed):
    """With a radius that reaches every cut, the candidates are all partitions: the search's
    ranked list must be the top K of a brute force over every way to cut the layers, scored by
    OmniBal's eq. 4 + 5 written out (squared deviations of stage times from their mean, plus the
    weighted activations sent at each cut)."""
    rng = np.random.default_rng(seed)
    n_layers, n = int(rng.integers(2, 9)), int(rng.integers(1, 5))
    n = min(n, n_layers)
    times = rng.integers(1, 20, n_layers).astype(float)
    acts = rng.integers(0, 10, n_layers).astype(float)
    w = float(rng.choice([0.0, 0.5, 3.0]))

    def score(cuts):
        edges = [0, *cuts, n_layers]
        stages = [sum(times[a:b]) for a, b in itertools.pairwise(edges)]
        mean = sum(stages) / len(stages)
        return sum((s - mean) ** 2 for s in stages) + w * sum(acts[c - 1] for c in cuts)

    every = sorted(
        ((score(c), c) for c in itertools.combinations(range(1, n_layers), n - 1)),
    )
    best, ranked = search_partition(times, acts, n, radius=n_layers, top_k=3, comm_weight=w)
    assert [p.score for p in ranked] == pytest.approx([s for s, _ in every[:3]])
    assert best.score == pytest.approx(every[0][0])
    assert score(best.bounds) == pytest.approx(best.score)
