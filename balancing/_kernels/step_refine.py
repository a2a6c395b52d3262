"""Refinement of a step's groups in every phase at once: samples move or swap between the D
groups of a step while that lowers the sum over the phases of the groups' squared loads (each
phase over its mean per group, so all weigh alike): the step's loads grow more even in every
phase together. ISF and the step sort make a step's groups alike in the vision tower and the
LLM; large items (videos) and a third phase (an audio encoder) need this. Plain-Python twin:
``balancing._reference.refine_step``.

A move takes sample ``a`` from group ``h`` to group ``l`` (a swap also brings ``b`` back):
with ``d_j`` the load it shifts in phase j and ``w_j`` the phase's weight, the sum of squares
changes by ``sum_j w_j^2 * 2 d_j (d_j - (L_hj - L_lj))``, in O(phases) per candidate.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# a move must lower the weighted sum of squares by more than this (loads over their mean are
# about 1 a group: a move of one sample of 16 gains ~1e-3; below 1e-5 the step is even to
# well under 1 %, and further moves only cost time)
EPS = 1e-5


@njit(cache=True)
def _improve(x, slot, loads, w, q, h, jw, key, in_h, in_l):
    """Apply the first partner's best move or swap with group ``h`` (partners lightest in phase
    ``jw`` first; see :func:`_nb_refine_step`); False if no partner has one that gains."""
    m, k = x.shape
    d = loads.shape[0]
    for r in range(d):
        key[r] = loads[r, jw]
    partners = np.argsort(key, kind="mergesort")
    for p in range(d):
        lg = partners[p]
        if lg == h:
            continue
        nh = 0
        nl = 0
        for i in range(m):  # the two groups' samples, in order
            if slot[i] == h:
                in_h[nh] = i
                nh += 1
            elif slot[i] == lg:
                in_l[nl] = i
                nl += 1
        best = -EPS
        best_a = -1
        best_b = -1
        for pa in range(nh):
            a = in_h[pa]
            for pb in range(-1, nl):
                b = in_l[pb] if pb >= 0 else -1
                ok = True
                gain = 0.0
                for j in range(k):
                    dj = float(x[a, j] - (x[b, j] if b >= 0 else 0))
                    if loads[lg, j] + dj > max(q[j], loads[lg, j]):
                        ok = False
                    if loads[h, j] - dj > max(q[j], loads[h, j]):
                        ok = False
                    gain += w[j] * w[j] * 2.0 * dj * (dj - (loads[h, j] - loads[lg, j]))
                if ok and gain < best:
                    best = gain
                    best_a = a
                    best_b = b
        if best_a >= 0:
            for j in range(k):
                dj = float(x[best_a, j] - (x[best_b, j] if best_b >= 0 else 0))
                loads[h, j] -= dj
                loads[lg, j] += dj
            slot[best_a] = lg
            if best_b >= 0:
                slot[best_b] = h
            return True
    return False


@njit(cache=True)
def _nb_refine_step(x, slot, d, q, max_moves):
    """Refine one step in place: ``x`` (m, k) the loads of its samples, ``slot[i]`` the group
    (0..d-1) of sample i, ``q`` each phase's cap (a group may not pass it, nor grow if already
    past it). Each move takes the phases heaviest group first (by its load over the phase's
    mean) and that phase's heaviest group ``h`` (the first on a tie); it tries every partner
    group, lightest in that phase first, and applies the first partner's best move or swap
    with ``h``: the largest fall of the weighted sum of squares, past ``EPS`` (ties to the
    earlier sample of ``h``, then the earlier of the partner, a move before a swap). Returns
    the moves made; stops when no phase's heaviest group has a move or after ``max_moves``."""
    m, k = x.shape
    loads = np.zeros((d, k))
    for i in range(m):
        for j in range(k):
            loads[slot[i], j] += x[i, j]
    w = np.zeros(k)
    for j in range(k):
        tot = 0.0
        for r in range(d):
            tot += loads[r, j]
        w[j] = d / tot if tot > 0 else 0.0
    key = np.zeros(d)
    in_h = np.empty(m, dtype=np.int64)
    in_l = np.empty(m, dtype=np.int64)
    heads = np.zeros(k)
    moves = 0
    while moves < max_moves:
        for j in range(k):  # each phase's heaviest group, weighted
            heads[j] = 0.0
            for r in range(d):
                heads[j] = max(heads[j], loads[r, j] * w[j])
        done = False
        for jw in np.argsort(-heads, kind="mergesort"):  # the heaviest phase first
            if heads[jw] <= 0.0:
                break  # the phases come heaviest first: none after this has a load
            h = 0
            for r in range(d):
                if loads[r, jw] * w[jw] == heads[jw]:
                    h = r
                    break
            if _improve(x, slot, loads, w, q, h, jw, key, in_h, in_l):
                moves += 1
                done = True
                break
        if not done:
            break
    return moves


@njit(cache=True)
def _nb_refine_steps(x, members, starts, slot, d, q, max_moves):
    """:func:`_nb_refine_step` on every step: its samples are ``members[starts[s]:starts[s +
    1]]`` (rows of ``x``), ``slot`` their groups' positions in the step (updated in place).
    Returns the moves made over all steps."""
    total = 0
    for s in range(starts.shape[0] - 1):
        idx = members[starts[s] : starts[s + 1]]
        sub = np.empty((idx.shape[0], x.shape[1]), dtype=x.dtype)
        sl = np.empty(idx.shape[0], dtype=np.int64)
        for p in range(idx.shape[0]):
            sub[p] = x[idx[p]]
            sl[p] = slot[idx[p]]
        total += _nb_refine_step(sub, sl, d, q, max_moves)
        for p in range(idx.shape[0]):
            slot[idx[p]] = sl[p]
    return total
