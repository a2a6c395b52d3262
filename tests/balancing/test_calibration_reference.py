"""The calibration fit against an independent reference of its stated rules.

``balancing/calibration.py`` documents its fit: relative residuals, scipy's ``soft_l1`` loss
with its knee at 1.4826 x the residuals' MAD (floored at 0.1 %) set three times, each from the
last fit's residuals; a negative coefficient fixed at zero, the largest pull at the data's scale
first; a term kept where it adds to the rank at tolerance 1e-9 x sqrt(points) of the
max-normalized columns. The reference here minimizes the same loss with its own solver
(iteratively reweighted least squares: the soft_l1 weights are 1/sqrt(1 + (r/f)^2)), so the two
agree only where the fit does what its docstring says.

Bugs these catch: a knee from the wrong spread (the residuals shifted before the MAD, another
factor than 1.4826, two or four rounds instead of three); a solver stopped early (a tolerance of
1 instead of 1e-12); the wrong negative term fixed first (the raw coefficient, or its value
over the data's scale, instead of its pull); a rank tolerance ten times off; a column of zeros
(items of length 0) divided by its own zero; a limit (MIN_SHARE, MAX_ERROR) that refuses the
value exactly at it; a dropped per-call constant left out of the report; an empty padded rank
that fails instead of costing nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from balancing import calibration
from balancing.calibration import _independent, features, fit_phase

TRUE = np.array([2e-6, 3e-9, 4e-3, 1e-3])  # alpha, beta, gamma, intercept


def _items(rng, n=40):
    return [rng.integers(16, 4000, int(rng.integers(1, 9))).tolist() for _ in range(n)]


def _design(items, padded=False):
    """The observations' columns (tokens, squares, items, 1), computed item by item."""
    rows = []
    for it in items:
        if padded:
            top = max(it)
            rows.append([len(it) * top, len(it) * top * top, len(it), 1.0])
        else:
            rows.append([sum(it), sum(n * n for n in it), len(it), 1.0])
    return np.array(rows, dtype=np.float64)


def _irls(a, b, c, f):
    """argmin_c sum f^2 * 2 (sqrt(1 + ((a c - b)/f)^2) - 1), by reweighted least squares."""
    for _ in range(2000):
        w = np.sqrt(1.0 / np.sqrt(1.0 + ((a @ c - b) / f) ** 2))
        nxt, *_ = np.linalg.lstsq(a * w[:, None], b * w, rcond=None)
        if np.array_equal(nxt, c):
            break
        c = nxt
    return c


def _reference_robust(x, y):
    a, b = x / y[:, None], np.ones(len(y))
    c, *_ = np.linalg.lstsq(a, b, rcond=None)
    for _ in range(3):
        r = a @ c - b
        mad = float(np.median(np.abs(r - np.median(r))))
        c = _irls(a, b, c, max(1.4826 * mad, 1e-3))
    return c


def _reference_fit(x, y):
    """The documented active set over the reference solver: coefficients and kept columns."""
    keep = [0, 1, 2, 3]
    while True:
        coef = np.zeros(4)
        coef[keep] = _reference_robust(x[:, keep], y)
        negative = [j for j in keep if coef[j] < 0]
        if not negative:
            return coef, keep
        pulls = {j: -coef[j] * x[:, j].mean() for j in negative}
        worst = max(pulls.values())
        keep.remove(min(j for j in negative if pulls[j] == worst))


def _coefs(fit):
    return np.array([fit.cost.alpha, fit.cost.beta, fit.cost.gamma, fit.intercept])


def _disturbed(seed, true=TRUE, noise=0.02, every=7, factor=1.8):
    rng = np.random.default_rng(seed)
    items = _items(rng)
    x = _design(items)
    y = x @ true * (1 + noise * rng.standard_normal(len(items)))
    y[::every] *= factor  # steps the machine disturbed
    return items, x, y


@pytest.mark.parametrize("seed", range(4))
def test_the_robust_fit_is_the_stated_loss_minimized(seed):
    """Times with 2 % noise and every seventh step 80 % slow: the fit equals the reference's
    minimizer of the same loss to 1e-6 (a knee off by the MAD's factor moves it by > 10 %)."""
    items, x, y = _disturbed(seed)
    fit = fit_phase("vision", y.tolist(), items)
    order = np.lexsort(x[:, :3].T[::-1])  # any order: the fit is order-free
    want, keep = _reference_fit(x[order], y[order])
    assert keep == [0, 1, 2, 3] and fit.dropped == ()
    np.testing.assert_allclose(_coefs(fit), want, rtol=1e-6)


@pytest.mark.parametrize(
    "true",
    [
        # squares and the constant negative: the constant pulls more and is fixed first;
        # refitted without it, the squares' term is no longer negative
        (5.1e-6, -4.5e-10, 2.3e-3, -4.8e-3),
        # the same pair, the squares' pull now the larger (its mean is 10^7 times the
        # constant's): fixed first, and the constant turns positive
        (5.3e-6, -9.5e-11, 5.4e-3, -5.9e-3),
        # the per-item term and the constant negative: the per-item one pulls more
        (5.2e-6, 7e-10, -3.7e-3, -1.9e-4),
    ],
)
def test_negative_terms_are_fixed_at_zero_largest_pull_first(true):
    """Times made with two negative terms: the fit fixes them at zero in the documented order
    (the term that pulls the most below zero at the data's scale first, then refits), as the
    reference does; the terms it reports dropped are those it fixed, the constant included."""
    items, x, y = _disturbed(11, np.array(true), noise=0.01, every=10**9, factor=1.0)
    fit = fit_phase("vision", y.tolist(), items)
    order = np.lexsort(x[:, :3].T[::-1])
    want, keep = _reference_fit(x[order], y[order])
    assert keep != [0, 1, 2, 3]
    names = ("alpha", "beta", "gamma", "intercept")
    assert fit.dropped == tuple(sorted(names[j] for j in range(4) if j not in keep))
    np.testing.assert_allclose(_coefs(fit), want, rtol=1e-6, atol=1e-15)


def _grows(items, secs, fit):
    """The share of the mean time the fitted terms explain, computed as fit_phase does (over
    its canonical order, so the float is the same to the last bit)."""
    data = np.array(sorted((s, *features(it, False)) for s, it in zip(secs, items, strict=True)))
    return float(data[:, 1:4].mean(axis=0) @ _coefs(fit)[:3]) / float(data[:, 0].mean())


def test_min_share_and_max_error_accept_the_value_exactly_at_them(monkeypatch):
    """The limits are inclusive: a fit whose items explain exactly MIN_SHARE of the time, and
    whose median error is exactly MAX_ERROR, is taken; one float past either is refused."""
    items, _, y = _disturbed(3, noise=0.05)
    secs = y.tolist()
    fit = fit_phase("vision", secs, items)
    grows = _grows(items, secs, fit)
    assert 0 < grows < 1 and fit.median_rel_error > 0
    for share, ok in ((grows, True), (np.nextafter(grows, 1.0), False)):
        monkeypatch.setattr(calibration, "MIN_SHARE", float(share))
        if ok:
            fit_phase("vision", secs, items)
        else:
            with pytest.raises(calibration.CalibrationError, match="does not grow"):
                fit_phase("vision", secs, items)
    monkeypatch.setattr(calibration, "MIN_SHARE", 1e-3)
    err = fit.median_rel_error
    for limit, ok in ((err, True), (np.nextafter(err, 0.0), False)):
        monkeypatch.setattr(calibration, "MAX_ERROR", float(limit))
        if ok:
            assert fit_phase("vision", secs, items).median_rel_error == err
        else:
            with pytest.raises(calibration.CalibrationError, match="median error"):
                fit_phase("vision", secs, items)


def _near_pair(points, gap):
    """Columns u and u + d, scaled to a max of 1, whose pair's smallest singular value is
    ``gap`` (d orthogonal to u), and a third column of ones."""
    rng = np.random.default_rng(points)
    u = rng.uniform(0.5, 1.0, points)
    d = rng.standard_normal(points)
    d -= (d @ u) / (u @ u) * u
    d /= np.linalg.norm(d)
    x = np.column_stack([u, u, np.ones(points)])
    scale = 1.0
    for _ in range(60):  # the second column's max moves with d: fix the gap after scaling
        v = u + scale * d
        xs = np.column_stack([u / u.max(), v / np.abs(v).max()])
        s = np.linalg.svd(xs, compute_uv=False)[-1]
        scale *= gap / s
    x[:, 1] = u + scale * d
    return x


@pytest.mark.parametrize("points", [16, 100])
@pytest.mark.parametrize(("factor", "kept"), [(0.5, False), (2.0, True)])
def test_a_nearly_dependent_term_is_kept_by_the_stated_tolerance(points, factor, kept):
    """Two columns whose smallest singular value (after scaling each to a max of 1) is half the
    tolerance 1e-9 x sqrt(points): the second is not separable and is left out; at twice the
    tolerance it is kept."""
    tol = 1e-9 * math.sqrt(points)
    x = _near_pair(points, factor * tol)
    assert _independent(x) == ([0, 1, 2] if kept else [0, 2])


@pytest.mark.parametrize("unit", [1e-3, 1e6])
def test_which_terms_are_separable_does_not_depend_on_units(unit):
    """Columns in other units (times in ms, lengths in thousands): the same columns are kept,
    as each is scaled to a max of 1 before the rank is taken."""
    for factor, _ in ((0.5, False), (2.0, True)):
        x = _near_pair(16, factor * 4e-9)
        assert _independent(x * unit) == _independent(x)


def test_items_of_length_zero_leave_their_columns_out():
    """Every item 0 long (a phase whose items carry no tokens): tokens and squares are columns
    of zeros; the fit keeps the per-item and per-call terms and predicts exactly."""
    rng = np.random.default_rng(5)
    items = [[0] * int(k) for k in rng.integers(1, 9, 30)]
    secs = [4e-3 * len(it) + 1e-3 for it in items]
    fit = fit_phase("audio", secs, items)
    assert set(fit.dropped) == {"alpha", "beta"}
    assert fit.cost.gamma == pytest.approx(4e-3, rel=1e-9)
    assert fit.intercept == pytest.approx(1e-3, rel=1e-9)
    x = _design(items)
    assert _independent(x) == [2, 3]


def test_an_empty_rank_costs_nothing_padded_or_not():
    """A rank with no items of a phase: no tokens, squares or items, padded or not, and its
    prediction is 0 s (no per-call constant where the phase did not run)."""
    assert features([], True) == (0.0, 0.0, 0.0)
    assert features([], False) == (0.0, 0.0, 0.0)
    assert features([7], True) == (7.0, 49.0, 1.0)
    rng = np.random.default_rng(6)
    items = _items(rng, 30)
    x = _design(items, padded=True)
    fit = fit_phase("audio", (x @ TRUE).tolist(), items, padded=True)
    assert fit.predict([]) == 0.0
    assert fit.predict([5, 9]) == pytest.approx(_design([[5, 9]], padded=True)[0] @ TRUE)


def test_the_fit_is_a_slotted_value_and_padded_is_keyword_only():
    rng = np.random.default_rng(7)
    items = _items(rng, 20)
    secs = (_design(items) @ TRUE).tolist()
    fit = fit_phase("llm", secs, items)
    assert not hasattr(fit, "__dict__")
    with pytest.raises(TypeError):
        fit_phase("llm", secs, items, False)
