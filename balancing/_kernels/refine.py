"""Refinement of a runtime partition: swaps between the heaviest and the lightest ranks, within the
count and length caps, until the spread stops improving.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balancing._kernels.heap import _ih_fix, _ih_heapify, _ih_init


@njit(cache=True)
def _seg_reinsert(items, lengths, lo, hi, p):
    """Move ``items[p]`` within the ascending segment ``items[lo:hi]`` to its sorted place."""
    v = items[p]
    x = lengths[v]
    while p > lo and lengths[items[p - 1]] > x:
        items[p] = items[p - 1]
        p -= 1
    while p + 1 < hi and lengths[items[p + 1]] < x:
        items[p] = items[p + 1]
        p += 1
    items[p] = v


@njit(cache=True)
def _nb_refine_swaps(lengths, order_desc, bins, d, target, max_swaps, cap, cap_lengths):
    """Lower the heaviest bins by swapping one item with the lightest bin.

    For the heaviest bin a and the lightest bin b (gap g = load_a - load_b) the pair x in a,
    y in b with 0 < x - y < g closest to g/2 is swapped, so item counts stay the same and the
    larger of the two loads drops; with ``cap`` > 0 no bin's sum of ``cap_lengths`` may pass it.
    Stops when the heaviest bin is at most ``target``, when no swap helps any heavy bin, or after
    ``max_swaps``. Each bin's items are kept sorted, so finding a swap is one merge walk over
    the items of a and b. Updates ``bins``; returns bin loads.
    """
    n = lengths.shape[0]
    loads = np.zeros(d)
    mem = np.zeros(d)
    start = np.zeros(d + 1, dtype=np.int64)
    for i in range(n):
        loads[bins[i]] += lengths[i]
        mem[bins[i]] += cap_lengths[i]
        start[bins[i] + 1] += 1
    for b in range(d):
        start[b + 1] += start[b]
    items = np.empty(n, dtype=np.int64)
    fill = start[:d].copy()
    for k in range(n - 1, -1, -1):  # ascending lengths within every bin
        i = order_desc[k]
        items[fill[bins[i]]] = i
        fill[bins[i]] += 1
    kmin, vmin, pmin = _ih_init(d)
    kmax, vmax, pmax = _ih_init(d)
    for b in range(d):
        kmin[b] = loads[b]
        kmax[b] = -loads[b]
    _ih_heapify(kmin, vmin, pmin, d)
    _ih_heapify(kmax, vmax, pmax, d)
    for _ in range(max_swaps):
        a = vmax[0]
        if kmax[0] == np.inf or loads[a] <= target:
            break
        b = vmin[0]
        gap = loads[a] - loads[b]
        half = gap / 2
        best_pa = -1
        best_pb = -1
        best_err = np.inf
        lo_b = start[b]
        hi_b = start[b + 1]
        lo = lo_b
        for pa in range(start[a], start[a + 1]):
            x = lengths[items[pa]]
            want = x - half
            # a's items ascend, so the first of b's items >= want only moves right (a merge walk)
            while lo < hi_b and lengths[items[lo]] < want:
                lo += 1
            for c in range(lo - 1, lo + 1):
                if lo_b <= c < hi_b:
                    delta = x - lengths[items[c]]
                    if cap > 0:
                        dm = cap_lengths[items[pa]] - cap_lengths[items[c]]
                        if mem[b] + dm > cap or mem[a] - dm > cap:
                            continue
                    if 0 < delta < gap:
                        err = abs(delta - half)
                        if err < best_err:
                            best_err = err
                            best_pa = pa
                            best_pb = c
        if best_pa < 0:
            kmax[pmax[a]] = np.inf  # no swap lowers this bin: set it aside
            _ih_fix(kmax, vmax, pmax, pmax[a], d)
            continue
        ia = items[best_pa]
        ib = items[best_pb]
        delta = lengths[ia] - lengths[ib]
        items[best_pa] = ib
        items[best_pb] = ia
        _seg_reinsert(items, lengths, start[a], start[a + 1], best_pa)
        _seg_reinsert(items, lengths, lo_b, hi_b, best_pb)
        bins[ia] = b
        bins[ib] = a
        loads[a] -= delta
        loads[b] += delta
        mem[a] += cap_lengths[ib] - cap_lengths[ia]
        mem[b] += cap_lengths[ia] - cap_lengths[ib]
        kmin[pmin[a]] = loads[a]
        _ih_fix(kmin, vmin, pmin, pmin[a], d)
        kmin[pmin[b]] = loads[b]
        _ih_fix(kmin, vmin, pmin, pmin[b], d)
        kmax[pmax[a]] = -loads[a]
        _ih_fix(kmax, vmax, pmax, pmax[a], d)
        if kmax[pmax[b]] != np.inf:
            kmax[pmax[b]] = -loads[b]
            _ih_fix(kmax, vmax, pmax, pmax[b], d)
    return loads
