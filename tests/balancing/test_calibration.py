"""The fit behind ``equishard calibrate``, against the coefficients that generated the times.

Planted bugs these catch: a fit that squares the sum of a rank's lengths instead of summing
their squares (or a padded phase costed unpadded), a plain least-squares fit that one disturbed
step pulls off, a fit whose result depends on the order the ranks' records arrive (ranks would
plan differently), a negative coefficient let through (a plan that gives more work to look
cheaper), a limit (points, error) off by one, a fit accepted on times that do not grow with the
work or that are NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing.calibration import (
    MAX_ERROR,
    MIN_POINTS,
    MIN_SHARE,
    CalibrationError,
    features,
    fit_phase,
)
from balancing.cost_model import PhaseCost

TRUE = PhaseCost(alpha=2e-6, beta=3e-9, gamma=4e-3)
INTERCEPT = 1e-3


def _seconds(items, cost=TRUE, intercept=INTERCEPT, padded=False):
    """The time the model states, computed item by item (independently of ``features``)."""
    if padded:
        top = max(items)
        return sum(cost.alpha * top + cost.beta * top * top + cost.gamma for _ in items) + intercept
    return sum(cost.alpha * n + cost.beta * n * n + cost.gamma for n in items) + intercept


def _observations(rng, n, *, lo=16, hi=4000, most=8):
    return [rng.integers(lo, hi, int(rng.integers(1, most + 1))).tolist() for _ in range(n)]


def _close(fit, cost=TRUE, intercept=INTERCEPT, rel=1e-6):
    got = (fit.cost.alpha, fit.cost.beta, fit.cost.gamma, fit.intercept)
    want = (cost.alpha, cost.beta, cost.gamma, intercept)
    for g, w in zip(got, want, strict=True):
        assert math.isclose(g, w, rel_tol=rel, abs_tol=rel * 1e-9), (got, want)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_exact_times_give_back_the_coefficients(seed, padded):
    rng = np.random.default_rng(seed)
    items = _observations(rng, 40)
    fit = fit_phase("vision", [_seconds(it, padded=padded) for it in items], items, padded=padded)
    _close(fit)
    assert fit.padded is padded and fit.points == 40 and fit.dropped == ()
    assert fit.median_rel_error < 1e-9
    for it in items[:5]:  # predictions are the model's times
        assert math.isclose(fit.predict(it), _seconds(it, padded=padded), rel_tol=1e-9)


def test_features_sum_squares_per_item_and_pad_to_the_longest():
    assert features([3, 4], padded=False) == (7.0, 25.0, 2.0)
    assert features([3, 4], padded=True) == (8.0, 32.0, 2.0)
    assert features([], padded=False) == (0.0, 0.0, 0.0)
    assert features([5], padded=False) == features([5], padded=True) == (5.0, 25.0, 1.0)


@pytest.mark.parametrize("seed", range(4))
def test_a_few_disturbed_steps_do_not_pull_the_fit(seed):
    """One rank-step in ten measured 4x too slow (a machine hiccup), the rest with 1 % noise:
    the robust fit predicts clean steps within 1 % (median) and its two large terms within
    3 %, where a plain least-squares fit is off by more than 5 %."""
    rng = np.random.default_rng(seed)
    items = _observations(rng, 120)
    secs = np.array([_seconds(it) for it in items])
    secs *= 1 + 0.01 * rng.standard_normal(secs.size)
    bad = rng.choice(secs.size, 12, replace=False)
    secs[bad] *= 4
    fit = fit_phase("llm", secs.tolist(), items)
    fresh = _observations(rng, 200)
    truth = np.array([_seconds(it) for it in fresh])
    assert np.median(fit.errors(truth, fresh)) < 0.01
    assert abs(fit.cost.beta / TRUE.beta - 1) < 0.03
    assert abs(fit.cost.gamma / TRUE.gamma - 1) < 0.03
    x = np.array([[*features(it, False), 1.0] for it in items])
    plain, *_ = np.linalg.lstsq(x, secs, rcond=None)
    pred = np.array([[*features(it, False), 1.0] for it in fresh]) @ plain
    assert np.median(np.abs(pred - truth) / truth) > 0.05


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_fit_is_the_same_in_any_order(seed):
    """Every rank fits from the same records, gathered in whatever order: the coefficients must
    be equal to the last bit, or ranks would plan different steps."""
    rng = np.random.default_rng(seed)
    items = _observations(rng, 30)
    secs = [_seconds(it) * (1 + 0.05 * rng.standard_normal()) for it in items]
    a = fit_phase("vision", secs, items)
    order = rng.permutation(len(items))
    b = fit_phase("vision", [secs[i] for i in order], [items[i] for i in order])
    assert a == b


def test_min_points_at_below_and_above():
    rng = np.random.default_rng(1)
    items = _observations(rng, MIN_POINTS + 1)
    secs = [_seconds(it) for it in items]
    with pytest.raises(CalibrationError, match=f"{MIN_POINTS - 1} measured rank-steps"):
        fit_phase("vision", secs[: MIN_POINTS - 1], items[: MIN_POINTS - 1])
    _close(fit_phase("vision", secs[:MIN_POINTS], items[:MIN_POINTS]))
    _close(fit_phase("vision", secs, items))
    # ranks without items do not count as points
    with pytest.raises(CalibrationError, match=f"{MIN_POINTS - 1} measured"):
        fit_phase("vision", [*secs[: MIN_POINTS - 1], 0.5], [*items[: MIN_POINTS - 1], []])


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1.0, float("inf")])
def test_a_time_that_is_no_positive_number_is_refused(bad):
    rng = np.random.default_rng(2)
    items = _observations(rng, 20)
    secs = [_seconds(it) for it in items]
    secs[5] = bad
    with pytest.raises(CalibrationError, match="not a finite number > 0"):
        fit_phase("llm", secs, items)


def test_times_that_do_not_grow_with_the_work_are_refused():
    rng = np.random.default_rng(3)
    items = _observations(rng, 20)
    with pytest.raises(CalibrationError, match="does not grow with the items"):
        fit_phase("llm", [0.25] * 20, items)


def test_time_that_falls_with_more_items_is_fixed_at_zero_not_negative():
    """Times made with a negative per-item term: the fit reports it fixed at zero, and every
    coefficient it gives is >= 0 (a PhaseCost refuses anything else)."""
    rng = np.random.default_rng(4)
    items = _observations(rng, 60, lo=500, hi=4000)
    secs = [2e-6 * sum(it) + 3e-9 * sum(n * n for n in it) - 1e-4 * len(it) + 0.01 for it in items]
    fit = fit_phase("vision", secs, items)
    assert "gamma" in fit.dropped and fit.cost.gamma == 0.0
    assert min(fit.cost.alpha, fit.cost.beta, fit.intercept) >= 0.0


def test_equal_lengths_everywhere_fit_one_term_and_predict_exactly():
    """Every item 256 long: squares are a multiple of tokens, and the count too; one of them
    carries the cost, the others are reported as not separable, predictions stay exact."""
    items = [[256] * k for k in range(1, 25)]
    secs = [_seconds(it) for it in items]
    fit = fit_phase("vision", secs, items)
    assert set(fit.dropped) == {"beta", "gamma"}
    for it, s in zip(items, secs, strict=True):
        assert math.isclose(fit.predict(it), s, rel_tol=1e-9)


@pytest.mark.parametrize(("noise", "ok"), [(0.8 * MAX_ERROR, True), (1.2 * MAX_ERROR, False)])
def test_median_error_limit_below_and_above(noise, ok):
    """Every time off by +-``noise`` (alternating, so no coefficient absorbs it): the fit's
    median error is ``noise``, accepted below the limit, refused above it."""
    rng = np.random.default_rng(5)
    items = _observations(rng, 80)
    secs = [_seconds(it) * (1 + (noise if i % 2 else -noise)) for i, it in enumerate(items)]
    if ok:
        assert fit_phase("llm", secs, items).median_rel_error <= MAX_ERROR
    else:
        with pytest.raises(CalibrationError, match="median error"):
            fit_phase("llm", secs, items)


@pytest.mark.parametrize(("share", "ok"), [(0.5 * MIN_SHARE, False), (2 * MIN_SHARE, True)])
def test_items_must_explain_a_share_of_the_time(share, ok):
    """A constant per call plus a per-token part worth ``share`` of the mean time: below
    MIN_SHARE the items explain nothing a plan could balance (refused), above it they do."""
    rng = np.random.default_rng(6)
    items = _observations(rng, 40)
    tokens = np.array([sum(it) for it in items], dtype=float)
    k = share / (1 - share) / tokens.mean()  # mean(k * tokens) / mean(y) == share
    secs = (5.0 + 5.0 * k * tokens).tolist()  # seconds far from 1: a share, not a power
    if ok:
        fit = fit_phase("vision", secs, items)
        assert math.isclose(fit.cost.alpha, 5.0 * k, rel_tol=1e-3)
    else:
        with pytest.raises(CalibrationError, match="does not grow"):
            fit_phase("vision", secs, items)


def test_prediction_and_errors_are_the_stated_quantities():
    """A rank with no items is predicted 0 s (the per-call constant only where it ran); the
    errors are relative: a prediction of 1 s against 2 s measured is 50 % off, against 0.5 s
    100 %."""
    rng = np.random.default_rng(8)
    items = _observations(rng, 30)
    fit = fit_phase("vision", [_seconds(it) for it in items], items)
    assert fit.predict([]) == 0.0
    one = items[0]
    p = fit.predict(one)
    assert fit.errors([2 * p, 0.5 * p], [one, one]) == pytest.approx([0.5, 1.0])


def test_a_fit_is_an_immutable_keyword_only_value_and_pairs_must_match():
    import dataclasses

    rng = np.random.default_rng(9)
    items = _observations(rng, 20)
    secs = [_seconds(it) for it in items]
    fit = fit_phase("llm", secs, items)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.intercept = 0.0
    with pytest.raises(TypeError):
        type(fit)("llm", fit.cost, 0.0, 20, False, 0.0, 0.0)
    with pytest.raises(ValueError):  # a time without its items (or items without a time)
        fit_phase("llm", secs[:-1], items)
