"""Timing shared by the simulated-DP benchmarks: best of a few runs, memoized by work size."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch


def best_time(fn: Callable[[], object], repeats: int = 2, device=None) -> float:
    """Fastest of ``repeats`` runs of ``fn`` in seconds (on a CUDA ``device``, synchronized, so
    the kernels are timed rather than their launch)."""
    cuda = device is not None and torch.device(device).type == "cuda"
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


class Memo:
    """Each key's time measured once (steps repeat the same shares of work)."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, float] = {}

    def __call__(self, key: Hashable, measure: Callable[[], float]) -> float:
        if key not in self._seen:
            self._seen[key] = measure()
        return self._seen[key]
