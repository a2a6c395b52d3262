"""Refinement of a runtime partition: the heaviest rank gives one item to, or swaps one with, the
lightest rank that can take it, within the count and memory caps, until the spread stops
improving. Plain-Python twin: ``balancing._reference.refine``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balancing._kernels.heap import _ih_fix, _ih_heapify, _ih_init, _ih_less


@njit(cache=True)
def _pair_step(lengths, items, cnt, a, b, gap, moves, width, cap, cap_lengths, mem):
    """The best swap (or, with ``moves``, move) between bin a and bin b: the change of a's load
    closest to gap/2 among those in (0, gap), as (position in a, position in b or -1 for a
    move); position -1 in a when nothing lowers max(load_a, load_b). Both bins' items ascend,
    so for each x in a only b's two items around x - gap/2 can be best (one merge walk)."""
    half = gap / 2
    best_pa = -1
    best_pb = -1
    best_err = np.inf
    nb = cnt[b]
    can_move = moves and nb < width
    lo = 0
    for pa in range(cnt[a]):
        ia = items[a, pa]
        x = lengths[ia]
        if can_move and 0 < x < gap and (cap <= 0 or mem[b] + cap_lengths[ia] <= cap):
            err = abs(x - half)
            if err < best_err:
                best_err = err
                best_pa = pa
                best_pb = -1
        want = x - half
        while lo < nb and lengths[items[b, lo]] < want:
            lo += 1
        for c in range(lo - 1, lo + 1):
            if 0 <= c < nb:
                ib = items[b, c]
                delta = x - lengths[ib]
                if 0 < delta < gap:
                    if cap > 0:
                        dm = cap_lengths[ia] - cap_lengths[ib]
                        if mem[b] + dm > cap or mem[a] - dm > cap:
                            continue
                    err = abs(delta - half)
                    if err < best_err:
                        best_err = err
                        best_pa = pa
                        best_pb = c
    return best_pa, best_pb


@njit(cache=True)
def _slot_up(walk, keys, vals, j):
    while j > 0:
        q = (j - 1) >> 1
        if _ih_less(keys, vals, walk[j], walk[q]):
            walk[j], walk[q] = walk[q], walk[j]
            j = q
        else:
            break


@njit(cache=True)
def _slot_sift(walk, keys, vals, size):
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and _ih_less(keys, vals, walk[c + 1], walk[c]):
            c += 1
        if _ih_less(keys, vals, walk[c], walk[j]):
            walk[c], walk[j] = walk[j], walk[c]
            j = c
        else:
            break


@njit(cache=True)
def _walk_next(walk, m, keys, vals, d):
    """One step of a lazy walk of a min-heap of ``d`` slots in ascending (key, value) order,
    the heap left as it is: ``walk[:m]`` is a small heap of the slots not yet visited whose
    parents were (start with ``walk[0] = 0``, ``m = 1``). Pops the least, pushes its two
    children; returns (that slot, the new ``m``)."""
    s = walk[0]
    m -= 1
    walk[0] = walk[m]
    _slot_sift(walk, keys, vals, m)
    for c in (2 * s + 1, 2 * s + 2):
        if c < d:
            walk[m] = c
            m += 1
            _slot_up(walk, keys, vals, m - 1)
    return s, m


@njit(cache=True)
def _remove_at(items, cnt, b, p):
    for q in range(p, cnt[b] - 1):
        items[b, q] = items[b, q + 1]
    cnt[b] -= 1


@njit(cache=True)
def _insert_sorted(items, cnt, lengths, b, i):
    p = cnt[b]
    x = lengths[i]
    while p > 0 and lengths[items[b, p - 1]] > x:
        items[b, p] = items[b, p - 1]
        p -= 1
    items[b, p] = i
    cnt[b] += 1


@njit(cache=True)
def _tree_set(tv, ti, size, p, v):
    """Set leaf ``p`` of the min tree to ``v`` and repair its ancestors."""
    j = size + p
    tv[j] = v
    j >>= 1
    while j >= 1:
        c = 2 * j
        if tv[c + 1] < tv[c]:
            c += 1
        if tv[j] == tv[c] and ti[j] == ti[c]:
            break  # the ancestors hold what they held
        tv[j] = tv[c]
        ti[j] = ti[c]
        j >>= 1


@njit(cache=True)
def _tree_prefix_min(tv, ti, size, q):
    """(least value, its leaf) over leaves ``[0, q)``; ties go to the lowest leaf."""
    best = np.inf
    leaf = -1
    lo = size
    hi = size + q
    while lo < hi:
        if lo & 1:
            if tv[lo] < best or (tv[lo] == best and ti[lo] < leaf):
                best = tv[lo]
                leaf = ti[lo]
            lo += 1
        if hi & 1:
            hi -= 1
            if tv[hi] < best or (tv[hi] == best and ti[hi] < leaf):
                best = tv[hi]
                leaf = ti[hi]
        lo >>= 1
        hi >>= 1
    return best, leaf


@njit(cache=True)
def _fix_bin(items, cnt, loads, lengths, rank, tv, ti, size, c):
    for k in range(cnt[c]):
        i = items[c, k]
        _tree_set(tv, ti, size, rank[i], loads[c] - lengths[i])


@njit(cache=True)
def _nb_refine(lengths, order_desc, bins, d, target, max_steps, cap, cap_lengths, max_count, moves):
    """Lower the heaviest bin, one step at a time, by the swap (or, with ``moves``, the move)
    with the lightest bin that admits one; see ``balancing._reference.refine`` for the rule.

    The lightest bin is tried first. When it admits nothing, the lightest bin that does is
    found without walking the bins: a swap of x (in the heaviest bin a) for y < x (in bin b)
    lowers max(load_a, load_b) iff load_b - y < load_a - x, so a min tree over every item in
    ascending length order holding load_bin - length answers "is there one for x" as a prefix
    minimum (a's own items never qualify). Under a cap the tree's bin may admit nothing, and
    the bins are then walked in ascending load order. Stops at ``target``, after
    ``max_steps``, or when no step lowers the heaviest bin. Updates ``bins``; returns loads.
    """
    n = lengths.shape[0]
    loads = np.zeros(d)
    mem = np.zeros(d)
    cnt = np.zeros(d, dtype=np.int64)
    for i in range(n):
        loads[bins[i]] += lengths[i]
        mem[bins[i]] += cap_lengths[i]
        cnt[bins[i]] += 1
    top = cnt.max() if d > 0 else 0
    width = top + max(4, top // 2)
    if max_count > 0:
        width = max(top, min(width, max_count))
    items = np.empty((d, max(width, 1)), dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    ascending = np.empty(n)
    cnt[:] = 0
    for k in range(n - 1, -1, -1):  # ascending lengths within every bin
        i = order_desc[k]
        b = bins[i]
        items[b, cnt[b]] = i
        cnt[b] += 1
        rank[i] = n - 1 - k
        ascending[n - 1 - k] = lengths[i]
    kmin, vmin, pmin = _ih_init(d)
    kmax, vmax, pmax = _ih_init(d)
    for b in range(d):
        kmin[b] = loads[b]
        kmax[b] = -loads[b]
    _ih_heapify(kmin, vmin, pmin, d)
    _ih_heapify(kmax, vmax, pmax, d)
    size = 1
    while size < n:
        size *= 2
    tv = np.empty(0)
    ti = np.empty(0, dtype=np.int64)
    walk = np.empty(d + 1, dtype=np.int64)
    for _ in range(max_steps):
        a = vmax[0]
        if loads[a] <= target:
            break
        b = vmin[0]
        pa, pb = _pair_step(
            lengths, items, cnt, a, b, loads[a] - loads[b], moves, width, cap, cap_lengths, mem
        )
        if pa < 0:
            if tv.size == 0:  # first time past the lightest bin: build the tree
                tv = np.full(2 * size, np.inf)
                ti = np.zeros(2 * size, dtype=np.int64)
                for p in range(size):
                    ti[size + p] = p
                for c in range(d):
                    for k in range(cnt[c]):
                        i = items[c, k]
                        tv[size + rank[i]] = loads[c] - lengths[i]
                for j in range(size - 1, 0, -1):
                    c = 2 * j
                    if tv[c + 1] < tv[c]:
                        c += 1
                    tv[j] = tv[c]
                    ti[j] = ti[c]
            slack = 0.0
            for k in range(cnt[a] - 1, -1, -1):
                x = lengths[items[a, k]]
                q = np.searchsorted(ascending, x)  # items shorter than x
                best, leaf = _tree_prefix_min(tv, ti, size, q)
                if loads[a] - x - best > slack:
                    slack = loads[a] - x - best
                    b = bins[order_desc[n - 1 - leaf]]
            if slack > 0:
                pa, pb = _pair_step(
                    lengths,
                    items,
                    cnt,
                    a,
                    b,
                    loads[a] - loads[b],
                    moves,
                    width,
                    cap,
                    cap_lengths,
                    mem,
                )
        if pa < 0 and (cap > 0 or max_count > 0):
            # under a cap the tree's bin may refuse: walk the bins in ascending load order
            # (a lazy walk of the min-heap: a small heap of its slots, keyed by their loads)
            walk[0] = 0
            m = 1
            while m > 0:
                s, m = _walk_next(walk, m, kmin, vmin, d)
                b = vmin[s]
                if loads[b] >= loads[a]:
                    break
                pa, pb = _pair_step(
                    lengths,
                    items,
                    cnt,
                    a,
                    b,
                    loads[a] - loads[b],
                    moves,
                    width,
                    cap,
                    cap_lengths,
                    mem,
                )
                if pa >= 0:
                    break
        if pa < 0:
            break
        ia = items[a, pa]
        _remove_at(items, cnt, a, pa)
        delta = lengths[ia]
        dm = cap_lengths[ia]
        if pb >= 0:
            ib = items[b, pb]
            _remove_at(items, cnt, b, pb)
            _insert_sorted(items, cnt, lengths, a, ib)
            bins[ib] = a
            delta -= lengths[ib]
            dm -= cap_lengths[ib]
        _insert_sorted(items, cnt, lengths, b, ia)
        bins[ia] = b
        loads[a] -= delta
        loads[b] += delta
        mem[a] -= dm
        mem[b] += dm
        for c in (a, b):
            kmin[pmin[c]] = loads[c]
            _ih_fix(kmin, vmin, pmin, pmin[c], d)
            kmax[pmax[c]] = -loads[c]
            _ih_fix(kmax, vmax, pmax, pmax[c], d)
            if tv.size:
                _fix_bin(items, cnt, loads, lengths, rank, tv, ti, size, c)
    return loads
