"""OrchMLLM's post-balancing for costs beyond the linear (its Alg. 4 ``quadratic`` and Alg. 5
``padded_attention``) against the objectives the paper states for them (Appendix A), evaluated
here directly on the assignments, with plain LPT (Alg. 1: the same largest-first order onto the
lightest batch, written here with ``heapq``) as the baseline they improve on:

* Alg. 4 minimizes max_i L_i + lambda * sum_j l_ij^2 (attention without padding): among
  batches within a tolerance of the lightest, the smallest square sum takes the item.
* Alg. 5 minimizes max_i L_i + lambda * b_i * (max_j l_ij)^2 (attention over padded batches):
  largest-first batches whose padded size stays within LPT's largest sum, then LPT.

Before, their tests asserted only that every item lands in one batch: the tolerance ignored
(Alg. 4 is then LPT) or a padded batch let past its bound passed."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from balancing.post_balance import post_balance

CASES = 200


def _lpt(x: np.ndarray, d: int) -> np.ndarray:
    heap = [(0.0, b) for b in range(d)]
    dest = np.empty(x.size, dtype=np.int64)
    for i in sorted(range(x.size), key=lambda i: (-x[i], i)):
        load, b = heapq.heappop(heap)
        dest[i] = b
        heapq.heappush(heap, (load + x[i], b))
    return dest


def _quadratic_objective(x, dest, d, lam) -> float:
    return max(x[dest == b].sum() + lam * (x[dest == b] ** 2).sum() for b in range(d))


def _padded_objective(x, dest, d, lam) -> float:
    out = 0.0
    for b in range(d):
        mine = x[dest == b]
        if mine.size:
            out = max(out, mine.sum() + lam * mine.size * mine.max() ** 2)
    return out


def _cases(seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(CASES):
        n, d = int(rng.integers(30, 200)), int(rng.integers(2, 9))
        x = np.round(np.exp(rng.normal(6.0, 1.0, n)))  # heavy-tailed, as sample lengths are
        yield x, d, float(rng.choice([0.3, 1.0, 3.0])) / x.mean()


@pytest.mark.parametrize("seed", [0, 1])
def test_quadratic_lowers_the_square_sum_objective_below_lpt(seed):
    """Measured: 0.5 % below LPT on average, below it in ~94 % of cases (equal to it when the
    tolerance is ignored, every time); never more than its tolerance above LPT's largest sum."""
    ratios, linear_excess = [], []
    for x, d, lam in _cases(seed):
        r = post_balance(x, d, method="quadratic")
        lpt = _lpt(x, d)
        ratios.append(
            _quadratic_objective(x, r.dest, d, lam) / _quadratic_objective(x, lpt, d, lam)
        )
        tolerance = 0.01 * x.sum() / d  # post_balance's default
        linear = np.bincount(r.dest, weights=x, minlength=d).max()
        linear_excess.append((linear - np.bincount(lpt, weights=x, minlength=d).max()) / tolerance)
    ratios = np.array(ratios)
    assert ratios.mean() < 0.998 and (ratios < 1).mean() > 0.8
    assert max(linear_excess) <= 1.0 + 1e-9


@pytest.mark.parametrize("seed", [0, 1])
def test_padded_attention_lowers_the_padded_objective_below_lpt(seed):
    """Measured: ~9 % below LPT on average, below it in ~75 % of cases."""
    ratios = []
    for x, d, lam in _cases(seed):
        r = post_balance(x, d, method="padded_attention")
        ratios.append(
            _padded_objective(x, r.dest, d, lam) / _padded_objective(x, _lpt(x, d), d, lam)
        )
    ratios = np.array(ratios)
    assert ratios.mean() < 0.95 and (ratios < 1).mean() > 0.6


def test_padded_attention_is_bounded_by_lpts_largest_sum():
    """Alg. 5's line 2: the bound on a padded batch is the objective of the algorithm without
    paddings (LPT's largest sum, computed here); the method's batches are the plain-Python
    Alg. 5 under that bound."""
    from balancing import _reference as R

    for x, d, _ in list(_cases(3))[:60]:
        bound = np.bincount(_lpt(x, d), weights=x, minlength=d).max()
        order = R.argsort_desc(x.tolist())
        want = R.padded_attention(x.tolist(), order, d, float(bound))
        got = post_balance(x, d, method="padded_attention").dest
        assert dict(enumerate(got.tolist())) == want
