"""Metric functions on hand-worked examples, including OmniBal's formulas."""

import numpy as np

from balancing.metrics import dist_ratio, efficiency, pad_ratio, step_dist_ratios


def test_dist_ratio_omnibal_eq2():
    # one step, D = 4 devices with 10, 8, 6, 10 tokens: sum(max - x) / (max * D) = (0+2+4+0)/40
    assert dist_ratio(np.array([[10, 8, 6, 10]])) == 6 / 40
    # averaged over steps; a perfectly even step counts 0
    assert np.allclose(step_dist_ratios(np.array([[5, 5], [4, 2]])), [0.0, 0.25])
    assert dist_ratio(np.array([[5, 5], [4, 2]])) == 0.125


def test_pad_ratio_omnibal_eq1():
    # batch of B = 3 with lengths 4, 2, 1 padded to 4: (0 + 2 + 3) / (4 * 3)
    assert pad_ratio(np.array([4, 2, 1]), np.array([0, 0, 0])) == 5 / 12
    # two batches averaged: second batch 3, 3 has no padding
    assert pad_ratio(np.array([4, 2, 1, 3, 3]), np.array([0, 0, 0, 1, 1])) == (5 / 12) / 2


def test_efficiency_is_sum_of_means_over_sum_of_maxes():
    loads = np.array([[10, 6], [4, 4]])
    assert efficiency(loads) == (8 + 4) / (10 + 4)
    assert efficiency(np.ones((3, 5))) == 1.0


def _reference(loads, lengths, batch_ids):
    """docs/concepts.md's definitions, written out with loops (steps or batches with nothing in them,
    0/0, are left out of dist ratio's and pad ratio's means; efficiency of no work is 1)."""
    dist = []
    for step in loads:
        mx = max(step)
        dist.append(sum(mx - x for x in step) / (mx * len(step)) if mx > 0 else 0.0)
    means = sum(sum(step) / len(step) for step in loads)
    maxes = sum(max(step) for step in loads)
    eff = means / maxes if maxes > 0 else 1.0
    pads = []
    for b in sorted(set(batch_ids)):
        lens = [x for x, g in zip(lengths, batch_ids, strict=True) if g == b]
        if max(lens) > 0:
            pads.append(sum(max(lens) - x for x in lens) / (max(lens) * len(lens)))
    return sum(dist) / len(dist), eff, (sum(pads) / len(pads) if pads else 0.0)


def test_metrics_equal_their_definitions_with_empty_steps_and_batches():
    rng = np.random.default_rng(0)
    for _ in range(300):
        steps, d = rng.integers(1, 6), rng.integers(1, 5)
        loads = rng.integers(0, 4, (steps, d)) * rng.integers(0, 2, (steps, 1))  # whole-zero steps
        n = int(rng.integers(1, 12))
        lengths = rng.integers(0, 3, n) * rng.integers(0, 2, n)
        batch_ids = rng.integers(0, 5, n)  # gaps: batch ids no sample has
        want = _reference(loads.tolist(), lengths.tolist(), batch_ids.tolist())
        got = (dist_ratio(loads), efficiency(loads), pad_ratio(lengths, batch_ids))
        assert np.allclose(got, want), (loads, lengths, batch_ids)


def test_no_work_is_full_efficiency_and_no_padding():
    assert efficiency(np.zeros((3, 4))) == 1.0  # nothing to do wastes no rank-time
    assert pad_ratio(np.array([0, 0, 5, 5]), np.array([0, 0, 1, 1])) == 0.0
    assert dist_ratio(np.zeros((2, 3))) == 0.0
