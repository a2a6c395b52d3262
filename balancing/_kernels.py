"""numba kernels of the balancing stage. Each has a plain-Python twin in ``_reference.py`` and a
test that both agree over many seeds. Kernels take and return numpy arrays only; randomness is
drawn by the caller, so a kernel is a pure function of its inputs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ----------------------------------------------------------------------------- offline: ISF


@njit(cache=True)
def _nb_isf_round(vo, to, qv, qt, qfv, qft, group_end, kept):
    """One ISF round over samples in their (already shuffled) order: ``vo``/``to`` are their
    vision and text loads in that order, so the pass reads memory sequentially.

    Sampling stage (OmniBal Alg. 1): add samples to the current group; when a sample would push
    the group over ``qv`` (vision) or ``qt`` (text), close the group and start a new one with it.
    Filtering stage (Alg. 2): keep a group when it reaches ``qfv`` or ``qft``; other groups
    dissolve and their samples stay for the next round.

    Writes ``group_end[g]`` (exclusive end of group g in the order) and ``kept[g]``; returns the
    number of groups.
    """
    n = vo.shape[0]
    g = 0
    sv = 0
    st = 0
    start = 0
    for k in range(n):
        if k > start and (sv + vo[k] > qv or st + to[k] > qt):
            group_end[g] = k
            kept[g] = sv >= qfv or st >= qft
            g += 1
            start = k
            sv = 0
            st = 0
        sv += vo[k]
        st += to[k]
    if n > start:
        group_end[g] = n
        kept[g] = sv >= qfv or st >= qft
        g += 1
    return g


@njit(cache=True)
def _nb_best_fit(order, v, t, qv, qt, window, group_of):
    """Pack samples ``order`` (largest first) best-fit into new groups under both caps.

    A sample goes to the open group it fills most (least slack left, in cap-normalized units)
    among those it fits in; else it opens a group. Only the ``window`` most recently opened
    groups stay open (bounded-space best fit: O(n * window)), and a group that cannot take even
    the smallest sample closes early. Writes ``group_of``; returns the group count.
    """
    n = order.shape[0]
    gv = np.zeros(n, dtype=np.int64)
    gt = np.zeros(n, dtype=np.int64)
    open_ids = np.empty(window, dtype=np.int64)
    n_open = 0
    ng = 0
    min_v = v[order[0]] if n else 0
    min_t = t[order[0]] if n else 0
    for k in range(n):
        min_v = min(min_v, v[order[k]])
        min_t = min(min_t, t[order[k]])
    for k in range(n):
        i = order[k]
        best = -1
        best_slot = -1
        best_slack = 3.0
        for slot in range(n_open):
            g = open_ids[slot]
            nv = gv[g] + v[i]
            nt = gt[g] + t[i]
            if nv <= qv and nt <= qt:
                slack = (qv - nv) / qv + (qt - nt) / qt
                if slack < best_slack:
                    best_slack = slack
                    best = g
                    best_slot = slot
        if best < 0:
            if n_open == window:  # close the oldest open group
                for slot in range(1, n_open):
                    open_ids[slot - 1] = open_ids[slot]
                n_open -= 1
            best = ng
            ng += 1
            open_ids[n_open] = best
            best_slot = n_open
            n_open += 1
        gv[best] += v[i]
        gt[best] += t[i]
        group_of[i] = best
        if gv[best] + min_v > qv or gt[best] + min_t > qt:  # full: close it
            for slot in range(best_slot + 1, n_open):
                open_ids[slot - 1] = open_ids[slot]
            n_open -= 1
    return ng


@njit(cache=True)
def _nb_apply_round(oi, ov, ot, group_end, kept, g, base, group_of, ri, rv, rt):
    """Give kept groups of a round ids ``base, base+1, ...`` (``group_of[oi[k]]``); copy the
    other samples (index ``oi``, loads ``ov``/``ot``) to ``ri``/``rv``/``rt`` in order.
    Returns (kept groups, samples in rest)."""
    start = 0
    nk = 0
    nr = 0
    for q in range(g):
        end = group_end[q]
        if kept[q]:
            for k in range(start, end):
                group_of[oi[k]] = base + nk
            nk += 1
        else:
            for k in range(start, end):
                ri[nr] = oi[k]
                rv[nr] = ov[k]
                rt[nr] = ot[k]
                nr += 1
        start = end
    return nk, nr


@njit(cache=True)
def _nb_sample_costs(vit, llm, values, offsets, a_v, b_v, a_t, b_t):
    """Modeled cost of every sample, both phases in one pass: vision ``a_v * vit + b_v * sum of
    squared image sequence lengths`` (``values``/``offsets``: the list column), LLM ``a_t * llm +
    b_t * llm**2``."""
    n = vit.shape[0]
    vc = np.empty(n)
    tc = np.empty(n)
    for i in range(n):
        acc = 0.0
        for k in range(offsets[i], offsets[i + 1]):
            acc += float(values[k]) * float(values[k])
        vc[i] = a_v * float(vit[i]) + b_v * acc
        x = float(llm[i])
        tc[i] = a_t * x + b_t * x * x
    return vc, tc


@njit(cache=True)
def _nb_group_max(ids, x, n_groups):
    out = np.zeros(n_groups)
    for i in range(ids.shape[0]):
        if x[i] > out[ids[i]]:
            out[ids[i]] = x[i]
    return out


@njit(cache=True)
def _nb_counting_argsort(keys, n_keys):
    """Stable argsort of small non-negative integer keys in O(n + n_keys)."""
    count = np.zeros(n_keys + 1, dtype=np.int64)
    for k in keys:
        count[k + 1] += 1
    for j in range(n_keys):
        count[j + 1] += count[j]
    out = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        out[count[keys[i]]] = i
        count[keys[i]] += 1
    return out


@njit(cache=True)
def _nb_place_on_nodes(loads_v, loads_t, nodes, per_node, node_out, local_out):
    """Place each step's D = nodes*per_node groups on (node, local rank).

    ``loads_*`` have shape (steps, D), normalized so both phases weigh alike. Groups go,
    heaviest (vision + LLM) first, to the node whose running load (the larger of its two phases
    after adding the group) stays lowest, among nodes with a free slot: every node's total is
    as even as possible in both phases.
    """
    steps, d = loads_v.shape
    for s in range(steps):
        key = loads_v[s] + loads_t[s]
        idx = np.argsort(-key, kind="mergesort")
        nv = np.zeros(nodes)
        nt = np.zeros(nodes)
        used = np.zeros(nodes, dtype=np.int64)
        for j in range(d):
            gidx = idx[j]
            best = -1
            best_val = np.inf
            for nd in range(nodes):
                if used[nd] < per_node:
                    val = max(nv[nd] + loads_v[s, gidx], nt[nd] + loads_t[s, gidx])
                    if val < best_val:
                        best_val = val
                        best = nd
            node_out[s, gidx] = best
            local_out[s, gidx] = used[best]
            used[best] += 1
            nv[best] += loads_v[s, gidx]
            nt[best] += loads_t[s, gidx]


# ----------------------------------------------------------------------------- runtime: LPT


@njit(cache=True)
def _ih_less(keys, vals, a, b):
    return keys[a] < keys[b] or (keys[a] == keys[b] and vals[a] < vals[b])


@njit(cache=True)
def _ih_swap(keys, vals, pos, a, b):
    keys[a], keys[b] = keys[b], keys[a]
    vals[a], vals[b] = vals[b], vals[a]
    pos[vals[a]] = a
    pos[vals[b]] = b


@njit(cache=True)
def _ih_fix(keys, vals, pos, j, size):
    """Restore the min-heap order around slot ``j`` (indexed heap: ``pos[val]`` is its slot)."""
    while j > 0:
        q = (j - 1) >> 1
        if _ih_less(keys, vals, j, q):
            _ih_swap(keys, vals, pos, j, q)
            j = q
        else:
            break
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and _ih_less(keys, vals, c + 1, c):
            c += 1
        if _ih_less(keys, vals, c, j):
            _ih_swap(keys, vals, pos, c, j)
            j = c
        else:
            break


@njit(cache=True)
def _ih_heapify(keys, vals, pos, size):
    """Bottom-up heap construction (sift-down only)."""
    for j in range(size // 2 - 1, -1, -1):
        k = j
        while True:
            c = 2 * k + 1
            if c >= size:
                break
            if c + 1 < size and _ih_less(keys, vals, c + 1, c):
                c += 1
            if _ih_less(keys, vals, c, k):
                _ih_swap(keys, vals, pos, c, k)
                k = c
            else:
                break


@njit(cache=True)
def _ih_init(d):
    keys = np.zeros(d)
    vals = np.arange(d)
    pos = np.arange(d)
    return keys, vals, pos


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
    while size > 1:
        a = vals[0]
        size -= 1
        _ih_swap(keys, vals, pos, 0, size)
        _ih_fix(keys, vals, pos, 0, size)
        b = vals[0]
        # merge b into a: a's heaviest with b's lightest
        new = np.empty(d)
        nh = np.empty(d, dtype=np.int64)
        nt = np.empty(d, dtype=np.int64)
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
        o = np.argsort(-new, kind="mergesort")
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


# ----------------------------------------------------------------------------- runtime: nodes


@njit(cache=True)
def _nb_local_first(lengths, order, src, d, per_node, target, dest):
    """Locality-first post-balancing: every rank keeps its own items (largest first, skipping
    those that would pass ``target``), overflow goes to the lightest rank of the same node that
    stays within ``target``, and what is left goes LPT-wise to the lightest rank anywhere."""
    n = order.shape[0]
    loads = np.zeros(d)
    pending = np.empty(n, dtype=np.int64)
    n_pending = 0
    for k in range(n):  # 1. keep at home
        i = order[k]
        r = src[i]
        if loads[r] == 0 or loads[r] + lengths[i] <= target:
            dest[i] = r
            loads[r] += lengths[i]
        else:
            pending[n_pending] = i
            n_pending += 1
    rest = np.empty(n_pending, dtype=np.int64)
    n_rest = 0
    for k in range(n_pending):  # 2. inside the node
        i = pending[k]
        base = (src[i] // per_node) * per_node
        best = -1
        for r in range(base, base + per_node):
            if loads[r] + lengths[i] <= target and (best < 0 or loads[r] < loads[best]):
                best = r
        if best >= 0:
            dest[i] = best
            loads[best] += lengths[i]
        else:
            rest[n_rest] = i
            n_rest += 1
    for k in range(n_rest):  # 3. anywhere: the lightest rank
        i = rest[k]
        best = 0
        for r in range(1, d):
            if loads[r] < loads[best]:
                best = r
        dest[i] = best
        loads[best] += lengths[i]
    return loads


@njit(cache=True)
def _nb_greedy_node_assign(benefit, per_node, node_of_batch):
    """Assign d batches to nodes (``per_node`` each), highest retained volume first."""
    d, nodes = benefit.shape
    flat = np.argsort(-benefit.ravel(), kind="mergesort")
    used = np.zeros(nodes, dtype=np.int64)
    node_of_batch[:] = -1
    placed = 0
    for f in flat:
        j = f // nodes
        nd = f % nodes
        if node_of_batch[j] < 0 and used[nd] < per_node:
            node_of_batch[j] = nd
            used[nd] += 1
            placed += 1
            if placed == d:
                break
    return placed


# ----------------------------------------------------------------------------- runtime: pipeline


@njit(cache=True)
def _nb_1f1b_times(fwd, bwd, order):
    """Simulate a 1F1B pipeline. ``fwd``/``bwd`` have shape (stages, microbatches); ``order``
    is the microbatch order. Stage s runs min(p-s-1, l) warm-up forwards, then alternates one
    forward and one backward, then drains backwards. An op starts when its stage is free and
    its input has arrived (forward from stage s-1, backward from stage s+1).
    Returns (start_f, end_f, start_b, end_b), each (stages, l), by position in ``order``."""
    p = fwd.shape[0]
    m = order.shape[0]
    sf = np.zeros((p, m))
    ef = np.zeros((p, m))
    sb = np.zeros((p, m))
    eb = np.zeros((p, m))
    n_ops = 2 * m
    kind = np.zeros((p, n_ops), dtype=np.int64)  # 0 forward, 1 backward
    pos = np.zeros((p, n_ops), dtype=np.int64)
    for s in range(p):
        warm = min(p - s - 1, m)
        k = 0
        f = 0
        b = 0
        while f < warm:
            kind[s, k] = 0
            pos[s, k] = f
            f += 1
            k += 1
        while f < m:
            kind[s, k] = 0
            pos[s, k] = f
            f += 1
            k += 1
            kind[s, k] = 1
            pos[s, k] = b
            b += 1
            k += 1
        while b < m:
            kind[s, k] = 1
            pos[s, k] = b
            b += 1
            k += 1
    done_f = np.zeros((p, m), dtype=np.bool_)
    done_b = np.zeros((p, m), dtype=np.bool_)
    ptr = np.zeros(p, dtype=np.int64)
    free = np.zeros(p)
    progressed = True
    while progressed:
        progressed = False
        for s in range(p):
            while ptr[s] < n_ops:
                k = ptr[s]
                j = pos[s, k]
                mb = order[j]
                if kind[s, k] == 0:
                    if s > 0 and not done_f[s - 1, j]:
                        break
                    ready = ef[s - 1, j] if s > 0 else 0.0
                    start = max(free[s], ready)
                    sf[s, j] = start
                    ef[s, j] = start + fwd[s, mb]
                    free[s] = ef[s, j]
                    done_f[s, j] = True
                else:
                    if s < p - 1 and not done_b[s + 1, j]:
                        break
                    ready = eb[s + 1, j] if s < p - 1 else ef[s, j]
                    start = max(free[s], ready)
                    sb[s, j] = start
                    eb[s, j] = start + bwd[s, mb]
                    free[s] = eb[s, j]
                    done_b[s, j] = True
                ptr[s] += 1
                progressed = True
    return sf, ef, sb, eb


# Per-group statistics: columns of the packed (n_groups, 7) result. One row per group keeps each
# sample's updates in one or two cache lines, which at 10M samples is what the time is spent on.
STAT_COUNT, STAT_SUM_V, STAT_SUM_T, STAT_SUM_VC, STAT_SUM_TC, STAT_MAX_V, STAT_MAX_T = range(7)


@njit(cache=True, inline="always")
def _add_to_stats(out, g, v, t, vc, tc):
    """Count one sample with loads (v, t, vc, tc) into row ``g`` of a stats table."""
    out[g, 0] += 1.0
    out[g, 1] += v
    out[g, 2] += t
    out[g, 3] += vc
    out[g, 4] += tc
    if v > out[g, 5]:
        out[g, 5] = v
    if t > out[g, 6]:
        out[g, 6] = t


@njit(cache=True)
def _nb_group_stats(ids, v, t, vc, tc, n_groups):
    """Count, sums (v, t, vc, tc) and maxima (v, t) of the samples of each group ``ids[i]``."""
    out = np.zeros((n_groups, 7))
    for i in range(ids.shape[0]):
        _add_to_stats(out, ids[i], v[i], t[i], vc[i], tc[i])
    return out


@njit(cache=True)
def _nb_block_stats(perm, b, v, t, vc, tc):
    """``_nb_group_stats`` for the groups ``perm[k*b:(k+1)*b]`` (the last may be short): random
    batching, read in batch order, without materializing each sample's batch id."""
    n = perm.shape[0]
    out = np.zeros(((n + b - 1) // b, 7))
    for i in range(n):
        j = perm[i]
        _add_to_stats(out, i // b, v[j], t[j], vc[j], tc[j])
    return out


@njit(cache=True)
def _nb_stats_pad_ratios(stats):
    """Mean pad ratio (count * max - sum) / (count * max) of the vision and the LLM tokens over
    the groups of a ``_nb_group_stats`` table whose maximum is > 0."""
    ra = 0.0
    na = 0
    rb = 0.0
    nb = 0
    for g in range(stats.shape[0]):
        c = stats[g, 0]
        if stats[g, 5] > 0:
            ra += (c * stats[g, 5] - stats[g, 1]) / (c * stats[g, 5])
            na += 1
        if stats[g, 6] > 0:
            rb += (c * stats[g, 6] - stats[g, 2]) / (c * stats[g, 6])
            nb += 1
    return ra / max(na, 1), rb / max(nb, 1)
