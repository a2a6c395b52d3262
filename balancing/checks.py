"""Checks on numbers where they enter the balancing algorithms: lengths, volumes, memory and
pipeline times must be finite and >= 0. A NaN compares false with everything, so one NaN left
in would put every item on one batch (Karmarkar-Karp) or make a greedy choice arbitrary; +inf
would make every batch look equally full."""

from __future__ import annotations

import numpy as np

from equishard.common.values import check_count

__all__ = ["MAX_MATRIX_RANKS", "MAX_RANKS", "finite_nonnegative", "rank_count", "ranks_in"]

MAX_RANKS = 1 << 20  # data-parallel ranks a plan or a runtime balance may have (arrays of d)
MAX_MATRIX_RANKS = 1 << 14  # ranks of the d x d traffic matrices (2 GiB of float64 at the cap)


def rank_count(value, name: str = "d", hi: int = MAX_RANKS) -> int:
    """A number of ranks, batches or stages: a whole number in 1..``hi``; ``ValueError`` naming
    it otherwise (2.5 or NaN ranks, or 10**9 of them, which would allocate arrays of that size
    and end the process out of memory)."""
    return check_count(name, value, 1, hi)


def finite_nonnegative(values, name: str = "lengths") -> np.ndarray:
    """``values`` as a contiguous float64 array; ``ValueError`` naming the first item that is
    NaN, infinite or negative, or saying that their sum is not finite."""
    x = np.ascontiguousarray(values, dtype=np.float64)
    if x.size:
        bad = ~np.isfinite(x) | (x < 0)
        if bad.any():
            i = int(np.flatnonzero(bad.ravel())[0])
            raise ValueError(
                f"{name} must be finite and >= 0; item {i} is {x.ravel()[i]!r} "
                f"({int(bad.sum())} such item(s) of {x.size})"
            )
        with np.errstate(over="ignore"):
            total = x.sum()
        if not np.isfinite(total):  # each finite, their sum not: every batch's load reads inf
            raise ValueError(
                f"{name} sum past the largest float (largest item {x.max()!r}); give them in "
                "units whose total is finite (tokens, not FLOPs squared)"
            )
    return x


def ranks_in(values, d: int, name: str, size: int | None = None) -> np.ndarray:
    """``values`` as contiguous int64 ranks, each in ``0..d-1`` (the kernels index arrays of
    size ``d`` with them, unchecked); ``size``: the number of items there must be."""
    r = np.asarray(values)
    whole = np.issubdtype(r.dtype, np.integer) or np.issubdtype(r.dtype, np.bool_)
    if r.size and not whole and not (np.all(np.isfinite(r)) and np.all(r == np.round(r))):
        raise ValueError(f"{name} must be whole rank numbers, got {r.ravel()[:5]!r}...")
    r = np.ascontiguousarray(r, dtype=np.int64)
    if size is not None and r.size != size:
        raise ValueError(f"{name} has {r.size} items, expected {size} (one per item)")
    if r.size and (r.min() < 0 or r.max() >= d):
        bad = int(np.flatnonzero((r < 0) | (r >= d))[0])
        raise ValueError(f"{name}[{bad}] is {int(r[bad])}, outside the ranks 0..{d - 1}")
    return r
