"""numba kernels of the balancing stage. Each has a plain-Python twin in ``_reference.py`` and a
test that both agree over many seeds. Kernels take and return numpy arrays only; randomness is
drawn by the caller, so a kernel is a pure function of its inputs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ----------------------------------------------------------------------------- offline: ISF


@njit(cache=True)
def _nb_isf_round(order, v, t, qv, qt, qfv, qft, group_end, kept):
    """One ISF round over the samples ``order`` (already shuffled).

    Sampling stage (OmniBal Alg. 1): add samples to the current group; when a sample would push
    the group over ``qv`` (vision) or ``qt`` (text), close the group and start a new one with it.
    Filtering stage (Alg. 2): keep a group when it reaches ``qfv`` or ``qft``; other groups
    dissolve and their samples stay for the next round.

    Writes ``group_end[g]`` (exclusive end of group g in ``order``) and ``kept[g]``; returns the
    number of groups.
    """
    n = order.shape[0]
    g = 0
    sv = 0
    st = 0
    start = 0
    for k in range(n):
        i = order[k]
        if k > start and (sv + v[i] > qv or st + t[i] > qt):
            group_end[g] = k
            kept[g] = sv >= qfv or st >= qft
            g += 1
            start = k
            sv = 0
            st = 0
        sv += v[i]
        st += t[i]
    if n > start:
        group_end[g] = n
        kept[g] = sv >= qfv or st >= qft
        g += 1
    return g


@njit(cache=True)
def _nb_best_fit(order, v, t, qv, qt, group_of):
    """Pack samples ``order`` (largest first) best-fit into new groups under both caps.

    A sample goes to the open group it fills most (least slack left, in cap-normalized units)
    among those it fits in; else it opens a group. A group that cannot take even the smallest
    sample any more is closed, so the scan stays short. Writes ``group_of``; returns the count.
    """
    n = order.shape[0]
    gv = np.zeros(n, dtype=np.int64)
    gt = np.zeros(n, dtype=np.int64)
    open_ids = np.empty(n, dtype=np.int64)
    n_open = 0
    ng = 0
    min_v = v[order[0]]
    min_t = t[order[0]]
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
            best = ng
            ng += 1
            open_ids[n_open] = best
            best_slot = n_open
            n_open += 1
        gv[best] += v[i]
        gt[best] += t[i]
        group_of[i] = best
        if gv[best] + min_v > qv or gt[best] + min_t > qt:  # full: close it
            n_open -= 1
            open_ids[best_slot] = open_ids[n_open]
    return ng


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
def _heap_push(keys, vals, size, key, val):
    i = size
    keys[i] = key
    vals[i] = val
    while i > 0:
        p = (i - 1) >> 1
        if keys[p] > keys[i] or (keys[p] == keys[i] and vals[p] > vals[i]):
            keys[p], keys[i] = keys[i], keys[p]
            vals[p], vals[i] = vals[i], vals[p]
            i = p
        else:
            break
    return size + 1


@njit(cache=True)
def _heap_replace_top(keys, vals, size, key, val):
    keys[0] = key
    vals[0] = val
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        c = left
        right = left + 1
        if right < size and (
            keys[right] < keys[left] or (keys[right] == keys[left] and vals[right] < vals[left])
        ):
            c = right
        if keys[c] < keys[i] or (keys[c] == keys[i] and vals[c] < vals[i]):
            keys[c], keys[i] = keys[i], keys[c]
            vals[c], vals[i] = vals[i], vals[c]
            i = c
        else:
            break


@njit(cache=True)
def _nb_lpt(sorted_lengths, d, bins_out):
    """LPT (OrchMLLM Alg. 1): items in the given (descending) order, each onto the bin with the
    least load (ties: lowest bin index). Writes the bin of each position; returns bin loads."""
    keys = np.zeros(d, dtype=np.float64)
    vals = np.empty(d, dtype=np.int64)
    size = 0
    for b in range(d):
        size = _heap_push(keys, vals, size, 0.0, b)
    loads = np.zeros(d, dtype=np.float64)
    for k in range(sorted_lengths.shape[0]):
        b = vals[0]
        loads[b] += sorted_lengths[k]
        bins_out[k] = b
        _heap_replace_top(keys, vals, size, loads[b], b)
    return loads
