"""Cost coefficients fitted to measured phase times (``equishard calibrate``).

Each observation is one phase on one rank in one step: its measured seconds and its items'
lengths (:mod:`equishard.contracts.phase_times`). The model is the cost model's
(:class:`~balancing.cost_model.PhaseCost`) plus a per-call constant::

    seconds = alpha * tokens + beta * sum(len**2) + gamma * items + intercept

For a padded phase (Whisper-style windows) every item costs as the longest: ``tokens`` is
``items * longest`` and the squares ``items * longest**2``. The intercept (launches, a call's
fixed cost) is the same on every rank, so it is reported but never balanced.

The fit is robust least squares of relative residuals (``scipy.optimize.least_squares`` with
the ``soft_l1`` loss, so that a step disturbed by the machine weighs less; each residual a share
of its time) over the observations in a canonical order, so
that every rank derives the same coefficients from the same measurements. No coefficient may
be negative (more work never takes less time): one that comes out negative is fixed at zero and
the rest fitted again (an active set, as non-negative least squares does), and the result says
which. A fit is refused, with :class:`CalibrationError`, when it has fewer than
:data:`MIN_POINTS` observations with items, a time that is not a finite number > 0, a time that
does not grow with the items (their terms explain less than :data:`MIN_SHARE` of it), or a
median relative error above
:data:`MAX_ERROR` (times too noisy to plan with: other jobs on the machine, or waits counted as
work). Callers then keep the proxy (the model's dimensions) and say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from balancing.cost_model import PhaseCost
from equishard.common.errors import EquishardError

__all__ = [
    "MAX_ERROR",
    "MIN_POINTS",
    "MIN_SHARE",
    "CalibrationError",
    "PhaseFit",
    "features",
    "fit_phase",
]

MIN_POINTS = 12  # observations (rank-steps with items) a phase needs; 4 parameters, 3 each
MAX_ERROR = 0.25  # the largest median relative error of a usable fit
MIN_SHARE = 1e-3  # the least share of the mean time the items' terms must explain
_COLUMNS = ("alpha", "beta", "gamma", "intercept")


class CalibrationError(EquishardError, ValueError):
    """Measurements that give no usable fit (the message says why and what to change)."""


def features(items, padded: bool) -> tuple[float, float, float]:
    """(tokens, sum of squared lengths, items) of one rank's items in a phase."""
    lens = np.asarray(items, dtype=np.float64)
    if lens.size == 0:
        return 0.0, 0.0, 0.0
    if padded:
        top = float(lens.max())
        return lens.size * top, lens.size * top * top, float(lens.size)
    return float(lens.sum()), float((lens * lens).sum()), float(lens.size)


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseFit:
    """A phase's fitted coefficients (seconds per token, per squared token, per item), its
    per-call constant, and the fit's relative errors over the observations it used."""

    phase: str
    cost: PhaseCost
    intercept: float
    points: int
    padded: bool
    median_rel_error: float
    p90_rel_error: float
    dropped: tuple[str, ...] = ()  # terms fixed at zero (negative, or not separable)

    def predict(self, items) -> float:
        """Predicted seconds of one rank's items in this phase (the constant included)."""
        tokens, sq, n = features(items, self.padded)
        return float(self.cost.of(tokens, sq, n)) + (self.intercept if n else 0.0)

    def errors(self, seconds, items) -> np.ndarray:
        """Relative errors ``|predicted - measured| / measured`` of observations."""
        pred = np.array([self.predict(it) for it in items])
        meas = np.asarray(seconds, dtype=np.float64)
        return np.abs(pred - meas) / meas

    def describe(self) -> dict:
        return {
            "points": self.points,
            "padded": self.padded,
            "intercept_s": self.intercept,
            "median_rel_error": self.median_rel_error,
            "p90_rel_error": self.p90_rel_error,
            "dropped": list(self.dropped),
        }


def _robust(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Robust least-squares coefficients of ``x @ c ~ y`` in relative terms: each residual is
    divided by its time (a step's noise is a share of it, and a disturbed small step must
    weigh as much as a disturbed large one). ``soft_l1``'s knee is set from the residuals'
    spread (MAD) three times, each from the last fit's, so that outliers stop setting it."""
    from scipy.optimize import least_squares

    xw = x / y[:, None]
    scale = np.abs(xw).max(axis=0)
    xs, ones = xw / scale, np.ones(len(y))
    c, *_ = np.linalg.lstsq(xs, ones, rcond=None)
    for _ in range(3):
        resid = xs @ c - ones
        mad = float(np.median(np.abs(resid - np.median(resid))))
        # floored at 0.1 %: a perfect fit's zero spread would make every point an outlier
        c = least_squares(
            lambda c: xs @ c - ones,
            c,
            loss="soft_l1",
            f_scale=max(1.4826 * mad, 1e-3),
            method="trf",
            x_scale="jac",
            xtol=1e-12,
            ftol=1e-12,
            gtol=1e-12,
            max_nfev=2000,
        ).x
    return c / scale


def fit_phase(phase: str, seconds, items, *, padded: bool = False) -> PhaseFit:
    """Fit ``phase``'s coefficients to observations: ``seconds[i]`` measured for ``items[i]``
    (one rank's item lengths). Observations without items are left out (a rank with nothing
    to run in the phase). :class:`CalibrationError` when no usable fit exists."""
    rows = [
        (float(s), *features(it, padded)) for s, it in zip(seconds, items, strict=True) if len(it)
    ]
    if len(rows) < MIN_POINTS:
        raise CalibrationError(
            f"{phase}: {len(rows)} measured rank-steps with items, at least {MIN_POINTS} needed "
            "for a fit; record more steps (or fewer warm-up steps)"
        )
    data = np.array(sorted(rows))  # canonical order: the same fit whatever order they came in
    y = data[:, 0]
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise CalibrationError(f"{phase}: a measured time is not a finite number > 0")
    x = np.column_stack([data[:, 1], data[:, 2], data[:, 3], np.ones(len(y))])
    keep = _independent(x)
    coef = np.zeros(4)
    while keep:
        coef = np.zeros(4)
        coef[keep] = _robust(x[:, keep], y)
        negative = [j for j in keep if coef[j] < 0]
        if not negative:
            break
        # the term that pulls the most below zero at the data's scale is fixed at zero first
        j = max(negative, key=lambda k: (-coef[k] * float(x[:, k].mean()), -k))
        keep = [k for k in keep if k != j]
    dropped = [_COLUMNS[j] for j in range(4) if j not in keep]
    grows = float(x[:, :3].mean(axis=0) @ coef[:3]) / float(y.mean())
    if grows < MIN_SHARE:
        raise CalibrationError(
            f"{phase}: the measured time does not grow with the items (they explain "
            f"{grows:.2%} of it, at least {MIN_SHARE:.1%} needed): the phase's own work is too "
            "small to measure, or its times are a constant (waits, launches)"
        )
    cost = PhaseCost(alpha=float(coef[0]), beta=float(coef[1]), gamma=float(coef[2]))
    pred = x @ coef
    rel = np.abs(pred - y) / y
    if float(np.median(rel)) > MAX_ERROR:
        raise CalibrationError(
            f"{phase}: the fit's median error is {float(np.median(rel)):.1%}, above "
            f"{MAX_ERROR:.0%}: the times are too noisy to plan with (other jobs on the machine?) "
            "or include waits on other ranks"
        )
    return PhaseFit(
        phase=phase,
        cost=cost,
        intercept=float(coef[3]),
        points=len(y),
        padded=padded,
        median_rel_error=float(np.median(rel)),
        p90_rel_error=float(np.quantile(rel, 0.9)),
        dropped=tuple(sorted(dropped)),
    )


def _independent(x: np.ndarray) -> list[int]:
    """The columns kept, in order, each where it adds to the rank of those before it (equal
    lengths everywhere make squares a multiple of tokens: one of them is enough)."""
    xs = x / np.where(np.abs(x).max(axis=0) > 0, np.abs(x).max(axis=0), 1.0)
    keep: list[int] = []
    for j in range(x.shape[1]):
        trial = [*keep, j]
        if np.linalg.matrix_rank(xs[:, trial], tol=1e-9 * math.sqrt(len(xs))) == len(trial):
            keep = trial
    return keep
