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
