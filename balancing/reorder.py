"""MMScale/DistTrain data-aware reordering (§5): across DP groups, and across microbatches.

* ``intra_batch_reorder`` (Alg. 2): samples in ascending size, each to the DP group with the
  least load (greedy number partitioning); returns the new order and each sample's group.
* ``mmscale_order`` (Alg. 3) for 1F1B pipelines: the smallest microbatch first (all stages
  start early), the p-1 smallest last (the unfilled cool-down intervals shrink), and the rest
  placed so each forward fills the stage-0 interval before the next backward arrives, with
  intervals measured on a simulated 1F1B timeline (``pipeline_times``).
* ``inter_microbatch_reorder``: Alg. 3's order (or the given one, when the timeline says it is
  faster), then pairwise swaps kept while they shorten the simulated makespan. Alg. 3 alone sits
  4-16 % above the best order on small cases (brute force over every order, lognormal costs), a
  random order 6-25 %; with the swaps, 0-2 % on average (tests/balancing/test_microbatch_order.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from balancing._kernels.schedule import (
    _nb_1f1b_ops,
    _nb_1f1b_times,
    _nb_makespan,
    _nb_swap_descent,
)
from balancing.checks import finite_nonnegative, rank_count, ranks_in
from equishard.common.values import check_count

__all__ = [
    "PipelineTimes",
    "inter_microbatch_reorder",
    "intra_batch_reorder",
    "mmscale_order",
    "pipeline_times",
]

MAX_SWAP_PASSES = 20
MAX_SWAP_WORK = 10_000_000  # pipeline ops a reordering may simulate (~3 ns each: ~30 ms)


def intra_batch_reorder(sizes: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, group): sample order with the m DP groups' samples consecutive, and the group of
    each sample (input index)."""
    sizes = finite_nonnegative(sizes, "sizes")
    m = rank_count(m, "m (DP groups)")
    asc = np.argsort(sizes, kind="stable")
    loads = np.zeros(m)
    group = np.empty(sizes.size, dtype=np.int64)
    for i in asc:
        g = int(np.argmin(loads))
        group[i] = g
        loads[g] += sizes[i]
    order = np.concatenate([asc[group[asc] == g] for g in range(m)]) if sizes.size else asc
    return order, group


@dataclass(frozen=True, slots=True)
class PipelineTimes:
    start_f: np.ndarray
    end_f: np.ndarray
    start_b: np.ndarray
    end_b: np.ndarray

    @property
    def makespan(self) -> float:
        return float(max(self.end_b.max(initial=0.0), self.end_f.max(initial=0.0)))

    def bubble_fraction(self, fwd: np.ndarray, bwd: np.ndarray) -> float:
        """Idle share of stage-time until the makespan: 1 - busy / (stages * makespan)."""
        total = self.makespan * fwd.shape[0]
        return 1.0 - float(fwd.sum() + bwd.sum()) / total if total > 0 else 0.0


def _stage_times(fwd, bwd, p: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) times, each (stages, l); ``bwd`` defaults to twice ``fwd``."""
    f = _as_stages(fwd, p)
    b = _as_stages(bwd, f.shape[0]) if bwd is not None else 2.0 * f
    if b.shape != f.shape:
        raise ValueError(f"bwd has shape {b.shape}, fwd {f.shape}; give one time per microbatch")
    return f, b


def _as_stages(x: np.ndarray, p: int | None) -> np.ndarray:
    x = finite_nonnegative(x, "stage times")
    if x.ndim == 1:
        p = rank_count(p, "p (pipeline stages)", 1 << 16) if p is not None else None
        if p is None:
            raise ValueError(
                "give per-stage times (stages x microbatches) or the number of stages p"
            )
        x = np.repeat(x[None, :], p, axis=0)
    return np.ascontiguousarray(x)


def pipeline_times(
    fwd: np.ndarray, bwd: np.ndarray | None = None, order=None, p: int | None = None
) -> PipelineTimes:
    """Simulated 1F1B timeline. 1-D times apply to all ``p`` stages; ``bwd`` defaults to 2x fwd."""
    f, b = _stage_times(fwd, bwd, p)
    o = np.arange(f.shape[1]) if order is None else ranks_in(order, f.shape[1], "order")
    if np.unique(o).size != o.size or o.size != f.shape[1]:
        raise ValueError(f"order must be a permutation of 0..{f.shape[1] - 1}")
    return PipelineTimes(*_nb_1f1b_times(f, b, o))


def _closest_subset(pool: list[int], weights: np.ndarray, k: int, target: float) -> list[int]:
    """k items of ``pool`` whose weights sum close to ``target`` (greedy: largest that fits)."""
    chosen: list[int] = []
    left = target
    cand = sorted(pool, key=lambda i: (-weights[i], i))
    for _ in range(min(k, len(cand))):
        fit = [i for i in cand if weights[i] <= left]
        pick = fit[0] if fit else cand[-1]
        chosen.append(pick)
        cand.remove(pick)
        left -= weights[pick]
    return chosen


def inter_microbatch_reorder(
    fwd: np.ndarray,
    p: int,
    bwd: np.ndarray | None = None,
    *,
    max_passes: int = MAX_SWAP_PASSES,
    max_work: int = MAX_SWAP_WORK,
) -> np.ndarray:
    """Order of l microbatches for a p-stage 1F1B pipeline: MMScale's Alg. 3 (``mmscale_order``),
    or the given order where the simulated timeline says it is faster, improved by pairwise
    swaps while one shortens the makespan (at most ``max_passes`` passes over the l(l-1)/2 pairs
    and ``max_work`` simulated ops, 2pl a simulation; times in BENCHMARKS.md).

    ``fwd`` is each microbatch's forward time on the first stage (1-D), or (stages, l) times;
    ``bwd`` defaults to twice ``fwd``.
    """
    f, b = _stage_times(fwd, bwd, p)
    check_count("max_passes", max_passes)
    check_count("max_work", max_work)
    start = mmscale_order(f, f.shape[0], b)
    ident = np.arange(start.size, dtype=np.int64)
    ops = _nb_1f1b_ops(f.shape[0], start.size)
    if _nb_makespan(f, b, ident, *ops) < _nb_makespan(f, b, start, *ops):
        start = ident
    max_evals = max_work // max(2 * f.size, 1)
    return _nb_swap_descent(f, b, start, max_passes, max_evals)


def mmscale_order(fwd: np.ndarray, p: int, bwd: np.ndarray | None = None) -> np.ndarray:
    """MMScale's Alg. 3 alone (ascending forward cost when l <= p); arguments as
    ``inter_microbatch_reorder``."""
    f, b = _stage_times(fwd, bwd, p)
    p = f.shape[0]
    n_mb = f.shape[1]
    w = f[0]
    if n_mb <= p:
        return np.argsort(w, kind="stable").astype(np.int64)
    pending = list(range(n_mb))
    first = min(pending, key=lambda i: (w[i], i))
    pending.remove(first)
    rear = sorted(pending, key=lambda i: (w[i], i))[: p - 1]
    for i in rear:
        pending.remove(i)
    ret = [first]
    while pending:
        # Interval before the next backward reaches stage 0, on the timeline of the order so far
        # (the pending microbatches, in their given order, stand in for the ones not chosen yet).
        fill = ret + pending + rear
        t = _nb_1f1b_times(f, b, np.asarray(fill, dtype=np.int64))
        i = len(ret)
        nb = i - (p - 1) if i >= p - 1 else 0
        arrive = t[2][0, nb]  # start of that backward on stage 0
        busy_until = t[1][0, len(ret) - 1]
        interval = max(arrive - busy_until, 0.0)
        k = p - 1 if len(ret) == 1 else 1
        pick = _closest_subset(pending, w, k, interval)
        for j in pick:
            pending.remove(j)
        ret.extend(pick)
    return np.asarray(ret + rear, dtype=np.int64)
