"""Runtime partition kernels: split one step's samples over d ranks (LPT, LPT with count and length
caps, Karmarkar-Karp, padded and quadratic-cost variants).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balancing._kernels.heap import _ih_fix, _ih_heapify, _ih_init, _ih_swap

INSERTION_MAX = 16  # _order_desc sorts by insertion up to this many values


@njit(cache=True)
def _nb_argsort_desc(x):
    """Indices sorting ``x`` descending, ties by index. Counting sort when ``x`` holds small
    non-negative integers (token counts), else a stable merge sort."""
    n = x.shape[0]
    if n == 0:
        return np.empty(0, dtype=np.int64)
    mx = x.max()
    mn = x.min()
    integral = mn >= 0 and mx < 4 * n + 65536
    if integral:
        for k in range(n):
            if x[k] != np.floor(x[k]):
                integral = False
                break
    if not integral:
        return np.argsort(-x, kind="mergesort")
    m = int(mx) + 1
    count = np.zeros(m + 1, dtype=np.int64)
    for k in range(n):
        count[m - 1 - int(x[k]) + 1] += 1
    for j in range(m):
        count[j + 1] += count[j]
    out = np.empty(n, dtype=np.int64)
    for k in range(n):
        key = m - 1 - int(x[k])
        out[count[key]] = k
        count[key] += 1
    return out


@njit(cache=True)
def _nb_lpt_capped(lengths, order, d, max_count, cap, cap_lengths, bins_out):
    """LPT (OrchMLLM Alg. 1): items in ``order`` (largest first), each onto the least-loaded bin
    (ties: lowest index), with at most ``max_count`` items per bin (<= 0: no limit) and at most
    ``cap`` of ``cap_lengths`` per bin (<= 0: no cap). Writes ``bins_out[item]``; returns the
    position in ``order`` of the first item that fits nowhere, or -1 when all are placed."""
    loads = np.zeros(d)
    mem = np.zeros(d)
    counts = np.zeros(d, dtype=np.int64)
    keys, vals, pos = _ih_init(d)
    for k in range(order.shape[0]):
        i = order[k]
        b = vals[0]
        if keys[0] == np.inf:
            return k
        if cap > 0 and mem[b] + cap_lengths[i] > cap:
            # The least-loaded bin is full in memory: take the least-loaded bin that fits.
            b = -1
            best = np.inf
            for c in range(d):
                free = max_count <= 0 or counts[c] < max_count
                if free and mem[c] + cap_lengths[i] <= cap and loads[c] < best:
                    best = loads[c]
                    b = c
            if b < 0:
                return k
        loads[b] += lengths[i]
        mem[b] += cap_lengths[i]
        counts[b] += 1
        bins_out[i] = b
        keys[pos[b]] = loads[b] if (max_count <= 0 or counts[b] < max_count) else np.inf
        _ih_fix(keys, vals, pos, pos[b], d)
    return -1


@njit(cache=True)
def _nb_lpt(lengths, order, d, bins_out):
    """Uncapped LPT on a winner tree that stores keys in its nodes (each update is one
    independent compare per level). Same assignment as a heap LPT with ties to the lowest bin."""
    size = 1
    while size < d:
        size *= 2
    tk = np.full(2 * size, np.inf)
    ti = np.zeros(2 * size, dtype=np.int64)
    for b in range(size):
        ti[size + b] = b
        if b < d:
            tk[size + b] = 0.0
    for j in range(size - 1, 0, -1):
        if tk[2 * j + 1] < tk[2 * j]:
            tk[j] = tk[2 * j + 1]
            ti[j] = ti[2 * j + 1]
        else:
            tk[j] = tk[2 * j]
            ti[j] = ti[2 * j]
    for k in range(order.shape[0]):
        i = order[k]
        b = ti[1]
        bins_out[i] = b
        j = size + b
        tk[j] += lengths[i]
        j >>= 1
        while j >= 1:
            left = 2 * j
            if tk[left + 1] < tk[left]:
                tk[j] = tk[left + 1]
                ti[j] = ti[left + 1]
            else:
                tk[j] = tk[left]
                ti[j] = ti[left]
            j >>= 1
    return tk[size : size + d].copy()


@njit(cache=True)
def _nb_padded_batches(sorted_asc, d, bins_out):
    """OrchMLLM Alg. 2 (padded batching): binary search the smallest bound b on
    count * max-length such that cutting the ascending items greedily into runs with
    (len + 1) * length <= b gives at most d runs. Writes the run of each position; returns b."""
    n = sorted_asc.shape[0]
    if n == 0:
        return 0.0
    lo = sorted_asc[n - 1]
    hi = sorted_asc[n - 1] * (n // d + 1)
    while lo < hi:
        mid = np.floor((lo + hi) / 2)
        runs = 1
        cnt = 0
        for k in range(n):
            if (cnt + 1) * sorted_asc[k] > mid:
                runs += 1
                cnt = 0
            cnt += 1
        if runs <= d:
            hi = mid
        else:
            lo = mid + 1
    run = 0
    cnt = 0
    for k in range(n):
        if (cnt + 1) * sorted_asc[k] > lo:
            run += 1
            cnt = 0
        cnt += 1
        bins_out[k] = run
    return lo


@njit(cache=True)
def _nb_lpt_quadratic(lengths, order, d, tolerance, bins_out):
    """OrchMLLM Alg. 4: LPT where bins whose linear loads lie within ``tolerance`` of the
    lightest count as tied, and the tie goes to the smallest sum of squared lengths."""
    lin = np.zeros(d)
    sq = np.zeros(d)
    for k in range(order.shape[0]):
        i = order[k]
        m = 0
        for b in range(1, d):
            if lin[b] < lin[m]:
                m = b
        best = m
        for b in range(d):
            if lin[b] - lin[m] < tolerance and sq[b] < sq[best]:
                best = b
        lin[best] += lengths[i]
        sq[best] += lengths[i] * lengths[i]
        bins_out[i] = best
    return lin


@njit(cache=True)
def _nb_padded_attention(lengths, order, d, bound, bins_out):
    """OrchMLLM Alg. 5 (padded attention, e.g. ConvTransformer): items largest first fill padded
    batches while count * (the batch's first, largest length) stays within ``bound`` (the no-padding
    LPT objective); after d batches the remaining items go LPT onto the batch sums."""
    n = order.shape[0]
    sums = np.zeros(d)
    used = 0
    cnt = 0
    first = 0.0
    k = 0
    while k < n:
        x = lengths[order[k]]
        if used == 0 or (cnt + 1) * first > bound:
            if used == d:
                break
            used += 1
            cnt = 0
            first = x
        bins_out[order[k]] = used - 1
        sums[used - 1] += x
        cnt += 1
        k += 1
    while k < n:
        i = order[k]
        m = 0
        for b in range(1, d):
            if sums[b] < sums[m]:
                m = b
        bins_out[i] = m
        sums[m] += lengths[i]
        k += 1
    return sums


@njit(cache=True)
def _order_desc(v, o):
    """Write to ``o`` the indices ordering ``v`` heaviest first, ties by index: what
    ``np.argsort(-v, kind="mergesort")`` gives, by insertion where ``v`` is short (no array
    allocated: Karmarkar-Karp's merges on few ranks were mostly allocation)."""
    d = v.shape[0]
    if d > INSERTION_MAX:
        o[:] = np.argsort(-v, kind="mergesort")
        return
    for j in range(d):
        k = j
        while k > 0 and v[o[k - 1]] < v[j]:  # stable: j goes after every equal one
            o[k] = o[k - 1]
            k -= 1
        o[k] = j


@njit(cache=True)
def _descending(v):
    """Whether ``v`` is non-increasing (a NaN anywhere: no)."""
    for j in range(v.shape[0] - 1):  # noqa: SIM110 (a loop numba compiles; no generator)
        if not v[j] >= v[j + 1]:
            return False
    return True


@njit(cache=True)
def _nb_karmarkar_karp(lengths, order, d, equal_count, bins_out):
    """Karmarkar-Karp largest differencing for d-way partitioning.

    Each partial solution holds d subset sums. Start: one per item (``equal_count``: one per
    run of d consecutive items of ``order``, one item per subset, so every subset ends with the
    same count when d divides n). Repeatedly merge the two solutions with the largest spread
    (max - min), pairing the heaviest subsets of one with the lightest of the other.
    Writes ``bins_out``; returns subset sums.
    """
    n = order.shape[0]
    p = (n + d - 1) // d if equal_count else n
    sums = np.zeros((p, d))
    # subset membership as linked lists: head/tail per (solution, subset), next per item
    head = np.full((p, d), -1, dtype=np.int64)
    tail = np.full((p, d), -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    for k in range(n):
        i = order[k]
        if equal_count:
            s = k // d
            j = k % d
        else:
            s = k
            j = 0
        sums[s, j] = lengths[i]
        head[s, j] = i
        tail[s, j] = i
    for s in range(p):
        sums_s = sums[s]
        if _descending(sums_s):  # as ``order`` gives it (heaviest first): the sort is a no-op
            continue
        o = np.argsort(-sums_s, kind="mergesort")  # keep each solution sorted descending
        sums[s] = sums_s[o]
        h = head[s].copy()
        t = tail[s].copy()
        for j in range(d):
            head[s, j] = h[o[j]]
            tail[s, j] = t[o[j]]
    # max-heap on spread via an indexed min-heap of negated keys
    keys = np.empty(p)
    vals = np.arange(p)
    pos = np.arange(p)
    for s in range(p):
        keys[s] = -(sums[s, 0] - sums[s, d - 1])
    _ih_heapify(keys, vals, pos, p)
    size = p
    new = np.empty(d)  # one merge's sums, heads, tails and their order, reused by every merge
    nh = np.empty(d, dtype=np.int64)
    nt = np.empty(d, dtype=np.int64)
    o = np.empty(d, dtype=np.int64)
    while size > 1:
        a = vals[0]
        size -= 1
        _ih_swap(keys, vals, pos, 0, size)
        _ih_fix(keys, vals, pos, 0, size)
        b = vals[0]
        # merge b into a: a's heaviest with b's lightest
        for j in range(d):
            jb = d - 1 - j
            new[j] = sums[a, j] + sums[b, jb]
            ha, ta, hb, tb = head[a, j], tail[a, j], head[b, jb], tail[b, jb]
            if ha < 0:
                nh[j], nt[j] = hb, tb
            elif hb < 0:
                nh[j], nt[j] = ha, ta
            else:
                nxt[ta] = hb
                nh[j], nt[j] = ha, tb
        _order_desc(new, o)
        for j in range(d):
            sums[b, j] = new[o[j]]
            head[b, j] = nh[o[j]]
            tail[b, j] = nt[o[j]]
        keys[0] = -(sums[b, 0] - sums[b, d - 1])
        _ih_fix(keys, vals, pos, 0, size)
    root = vals[0]
    for j in range(d):
        i = head[root, j]
        while i >= 0:
            bins_out[i] = j
            i = nxt[i]
    return sums[root].copy()
