"""Refinement of a step's groups in every phase at once: samples move or swap between the D
groups of a step until no single move or swap lowers the sum over the phases of the heaviest
group's load (each phase over its mean, so all weigh alike). ISF and the step sort make a
step's groups alike in the vision tower and the LLM; a third phase (an audio encoder) needs
this. Plain-Python twin: ``balancing._reference.refine_step``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EPS = 1e-9  # a gain below this is rounding, not progress


@njit(cache=True)
def _objective(loads, w, skip_a, skip_b, rest):
    """``rest[j]``: the heaviest weighted load of phase j over the groups but ``skip_a`` and
    ``skip_b``."""
    d, k = loads.shape
    for j in range(k):
        m = 0.0
        for r in range(d):
            if r != skip_a and r != skip_b and loads[r, j] * w[j] > m:
                m = loads[r, j] * w[j]
        rest[j] = m


@njit(cache=True)
def _score(rest, w, a_loads, b_loads):
    s = 0.0
    for j in range(rest.shape[0]):
        s += max(rest[j], a_loads[j] * w[j], b_loads[j] * w[j])
    return s


@njit(cache=True)
def _improve(x, slot, loads, w, q, h, jw, rest, new_h, new_l, key, in_h, in_l):
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
        _objective(loads, w, h, lg, rest)
        best = _score(rest, w, loads[h], loads[lg]) - EPS
        best_a = -1
        best_b = -1
        nh = 0
        nl = 0
        for i in range(m):  # the two groups' samples, in order
            if slot[i] == h:
                in_h[nh] = i
                nh += 1
            elif slot[i] == lg:
                in_l[nl] = i
                nl += 1
        for pa in range(nh):
            a = in_h[pa]
            for pb in range(-1, nl):
                b = in_l[pb] if pb >= 0 else -1
                ok = True
                for j in range(k):
                    back = x[b, j] if b >= 0 else 0
                    new_h[j] = loads[h, j] - x[a, j] + back
                    new_l[j] = loads[lg, j] + x[a, j] - back
                    if new_l[j] > max(q[j], loads[lg, j]) or new_h[j] > max(q[j], loads[h, j]):
                        ok = False
                if ok:
                    s = _score(rest, w, new_h, new_l)
                    if s < best:
                        best = s
                        best_a = a
                        best_b = b
        if best_a >= 0:
            for j in range(k):
                back = x[best_b, j] if best_b >= 0 else 0
                loads[h, j] += back - x[best_a, j]
                loads[lg, j] += x[best_a, j] - back
            slot[best_a] = lg
            if best_b >= 0:
                slot[best_b] = h
            return True
    return False


@njit(cache=True)
def _nb_refine_step(x, slot, d, q, max_moves):
    """Refine one step in place: ``x`` (m, k) the loads of its samples, ``slot[i]`` the group
    (0..d-1) of sample i, ``q`` each phase's cap (a group may not pass it, nor grow if already
    past it). Each move takes the phase whose heaviest group is heaviest over its mean and that
    group ``h``; it tries every partner group, lightest in that phase first, and applies the
    first partner's best move or swap with ``h`` (the lowest sum of the phases' maxima, ties
    to the earlier sample of ``h``, then the earlier of the partner, a move before a swap).
    Returns the moves made; stops when none gains or after ``max_moves``."""
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
    rest = np.zeros(k)
    new_h = np.zeros(k)
    new_l = np.zeros(k)
    key = np.zeros(d)
    in_h = np.empty(m, dtype=np.int64)
    in_l = np.empty(m, dtype=np.int64)
    moves = 0
    heads = np.zeros(k)
    while moves < max_moves:
        for j in range(k):  # each phase's heaviest group, weighted
            heads[j] = 0.0
            for r in range(d):
                heads[j] = max(heads[j], loads[r, j] * w[j])
        done = False
        for jw in np.argsort(-heads, kind="mergesort"):  # the heaviest phase first
            if heads[jw] <= 0.0:
                break
            h = 0
            for r in range(d):
                if loads[r, jw] * w[jw] == heads[jw]:
                    h = r
                    break
            if _improve(x, slot, loads, w, q, h, jw, rest, new_h, new_l, key, in_h, in_l):
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
