"""ISF kernels (OmniBal's iterative sampling and filtering, offline): one round's quotas, the best-
fit fill of a round's groups, and applying a round.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
