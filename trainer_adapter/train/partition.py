"""Balanced pipeline partitioning (OmniBal §4.2).

Given each layer's profiled forward time and output activation size (for the fixed input sizes
that ISF grouping makes possible):

1. the **anchor** partition cuts the layer sequence greedily where the running time crosses
   ``k * total / N``, so the N stages' times are close;
2. **candidates** jitter every cut of the anchor within ``radius`` layers ((2r+1)^(N-1) of them);
3. candidates are **ranked** by VAR(stage forward time) + SUM(activations sent between stages)
   (eq. 4 and 5; ``comm_weight`` converts activations to the time unit of the variance);
4. the top K get a **timed trial** (``trial(bounds) -> seconds``) and the fastest wins.

A cut ``b`` means layer ``b`` starts a new stage; ``bounds`` are the N-1 cuts.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Partition",
    "anchor_partition",
    "layer_count_partition",
    "partition_candidates",
    "profile_layers",
    "score_partition",
    "search_partition",
    "stage_ranges",
]


@dataclass(frozen=True, slots=True)
class Partition:
    bounds: tuple[int, ...]
    stage_times: tuple[float, ...]
    variance: float
    comm: float
    score: float
    trial_seconds: float | None = None


def stage_ranges(bounds: Sequence[int], n_layers: int) -> list[tuple[int, int]]:
    """[lo, hi) layer range of every stage."""
    edges = [0, *bounds, n_layers]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _check(times: np.ndarray, n: int) -> None:
    if n < 1:
        raise ValueError(f"need at least one pipeline stage, got {n}")
    if times.size < n:
        raise ValueError(f"{times.size} layers cannot fill {n} stages (each needs one)")
    if not np.isfinite(times).all() or (times < 0).any():
        raise ValueError("layer times must be finite and >= 0")


def anchor_partition(times: Sequence[float], n: int) -> tuple[int, ...]:
    """Greedy cuts at the layer where the prefix time is closest to k * total / n."""
    t = np.asarray(times, dtype=np.float64)
    _check(t, n)
    prefix = np.cumsum(t)
    cuts: list[int] = []
    for k in range(1, n):
        lo = (cuts[-1] if cuts else 0) + 1
        hi = t.size - (n - k)  # leave a layer for every later stage
        target = prefix[-1] * k / n
        # cut c: layers [.., c) before it, prefix[c - 1] time
        cands = np.arange(lo, hi + 1)
        cuts.append(int(cands[np.argmin(np.abs(prefix[cands - 1] - target))]))
    return tuple(cuts)


def layer_count_partition(n_layers: int, n: int) -> tuple[int, ...]:
    """The usual split: as equal numbers of layers per stage as possible."""
    if not 1 <= n <= n_layers:
        raise ValueError(f"{n_layers} layers cannot fill {n} stages")
    return tuple(round(n_layers * k / n) for k in range(1, n))


def partition_candidates(
    anchor: Sequence[int], radius: int, n_layers: int
) -> list[tuple[int, ...]]:
    """Every jitter of the anchor's cuts within ``radius`` that keeps each stage non-empty."""
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    out = []
    for offs in itertools.product(range(-radius, radius + 1), repeat=len(anchor)):
        b = tuple(a + o for a, o in zip(anchor, offs, strict=True))
        if all(x < y for x, y in zip((0, *b), (*b, n_layers), strict=True)):
            out.append(b)
    return out


def score_partition(
    times: Sequence[float],
    activations: Sequence[float],
    bounds: Sequence[int],
    comm_weight: float = 1.0,
) -> Partition:
    """VAR(stage forward time) + comm_weight * SUM(activations of the last layer before a cut)."""
    t = np.asarray(times, dtype=np.float64)
    a = np.asarray(activations, dtype=np.float64)
    stage = np.array([t[lo:hi].sum() for lo, hi in stage_ranges(bounds, t.size)])
    var = float(((stage - stage.mean()) ** 2).sum())
    comm = float(sum(a[b - 1] for b in bounds))
    return Partition(
        tuple(int(b) for b in bounds), tuple(stage.tolist()), var, comm, var + comm_weight * comm
    )


def search_partition(
    times: Sequence[float],
    activations: Sequence[float],
    n: int,
    *,
    radius: int = 1,
    top_k: int = 3,
    comm_weight: float = 1.0,
    trial: Callable[[tuple[int, ...]], float] | None = None,
) -> tuple[Partition, list[Partition]]:
    """(chosen, ranked top K); with ``trial`` the top K are timed and the fastest is chosen."""
    t = np.asarray(times, dtype=np.float64)
    _check(t, n)
    if len(activations) != t.size:
        raise ValueError(f"{len(activations)} activation sizes for {t.size} layers")
    acts = np.asarray(activations, dtype=np.float64)
    if not np.isfinite(acts).all() or (acts < 0).any():
        raise ValueError("activation sizes must be finite and >= 0")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    anchor = anchor_partition(t, n)
    ranked = sorted(
        (
            score_partition(t, activations, b, comm_weight)
            for b in partition_candidates(anchor, radius, t.size)
        ),
        key=lambda p: (p.score, p.bounds),
    )[:top_k]
    if trial is None:
        return ranked[0], ranked
    timed = [
        Partition(p.bounds, p.stage_times, p.variance, p.comm, p.score, float(trial(p.bounds)))
        for p in ranked
    ]
    return min(timed, key=lambda p: (p.trial_seconds, p.score)), timed


def _sync() -> None:
    """Wait for queued GPU work, so that a wall-clock interval measures kernels, not launches."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def profile_layers(layers: Sequence[Callable[[], object]], repeats: int = 3) -> np.ndarray:
    """Median wall time of each callable (one layer's forward on the fixed input), after a
    warm-up call; on a GPU each interval starts and ends with a synchronize."""
    out = np.empty(len(layers))
    for i, fn in enumerate(layers):
        fn()
        runs = []
        for _ in range(repeats):
            _sync()
            t0 = time.perf_counter()
            fn()
            _sync()
            runs.append(time.perf_counter() - t0)
        out[i] = float(np.median(runs))
    return out
