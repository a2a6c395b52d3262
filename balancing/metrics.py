"""Balance metrics, defined once (docs/concepts.md, Metrics) and used by the CLI, benchmarks and tests.

For a step with D ranks and per-rank loads x_1..x_D:

* dist ratio = sum(max - x_i) / (max * D), averaged over steps (OmniBal eq. 2);
* efficiency = sum over steps of mean / sum over steps of max (1.0 = perfect);
* pad ratio (padded batching) = sum(max_len - len_i) / (max_len * B) per batch of B samples,
  averaged over batches (OmniBal eq. 1).
"""

from __future__ import annotations

import numpy as np

from balancing._kernels.tables import _nb_group_max
from balancing.checks import finite_nonnegative

__all__ = ["dist_ratio", "efficiency", "pad_ratio", "step_dist_ratios"]


def step_dist_ratios(loads: np.ndarray) -> np.ndarray:
    """Dist ratio of each step; ``loads`` has shape (steps, D). Steps with zero load count 0."""
    loads = np.asarray(loads, dtype=np.float64)
    full = loads.max(axis=1) * loads.shape[1]  # sum(max - x_i) = D * max - sum(x_i)
    return np.divide(full - loads.sum(axis=1), full, out=np.zeros(len(loads)), where=full > 0)


def dist_ratio(loads: np.ndarray) -> float:
    """Mean dist ratio over steps (0 = every rank equally loaded in every step)."""
    loads = np.asarray(loads)
    return float(step_dist_ratios(loads).mean()) if loads.size else 0.0


def efficiency(loads: np.ndarray) -> float:
    """sum_steps mean(x) / sum_steps max(x): the fraction of rank-time doing useful work."""
    loads = np.asarray(loads, dtype=np.float64)
    mx = loads.max(axis=1).sum()
    return float(loads.mean(axis=1).sum() / mx) if mx > 0 else 1.0


def pad_ratio(lengths: np.ndarray, batch_ids: np.ndarray) -> float:
    """Mean pad ratio over batches: the share of a padded batch that is padding.

    ``lengths[i]`` is sample i's length and ``batch_ids[i]`` (a non-negative integer) its batch.
    """
    lengths = finite_nonnegative(lengths)
    batch_ids = np.ascontiguousarray(batch_ids, dtype=np.int64)
    if batch_ids.shape != lengths.shape:
        raise ValueError(f"{batch_ids.size} batch ids for {lengths.size} lengths")
    if lengths.size == 0:
        return 0.0
    n_batches = int(batch_ids.max()) + 1
    counts = np.bincount(batch_ids, minlength=n_batches)
    mx = _nb_group_max(batch_ids, lengths, n_batches)
    total = np.bincount(batch_ids, weights=lengths, minlength=n_batches)
    ok = mx > 0
    ratios = (mx[ok] * counts[ok] - total[ok]) / (mx[ok] * counts[ok])
    return float(ratios.mean()) if ratios.size else 0.0
