"""ISF kernels (OmniBal's iterative sampling and filtering, offline): one round's quotas, the best-
fit fill of a round's groups, and applying a round.

Every kernel takes a sample's loads as a row of ``k`` phases (the vision tower, any other
encoder such as an audio one, the LLM) with one cap and one keep target per phase, so a group
stays under every phase's cap and is kept once it reaches any phase's target. Plain-Python
twins: ``balancing._reference.isf_round``, ``apply_round``, ``best_fit``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _reaches(sums, qf):
    """Does a group of ``sums`` reach any phase's keep target ``qf``?"""
    reach = False
    for j in range(qf.shape[0]):
        if sums[j] >= qf[j]:
            reach = True
    return reach


@njit(cache=True)
def _round_two(lo, qv, qt, qfv, qft, group_end, kept):
    """:func:`_nb_isf_round` for two phases (vision, LLM), the sums in registers: the common
    image + text case runs 2.5x faster than through the loops over phases."""
    n = lo.shape[0]
    g = 0
    sv = 0
    st = 0
    start = 0
    for i in range(n):
        if i > start and (sv + lo[i, 0] > qv or st + lo[i, 1] > qt):
            group_end[g] = i
            kept[g] = sv >= qfv or st >= qft
            g += 1
            start = i
            sv = 0
            st = 0
        sv += lo[i, 0]
        st += lo[i, 1]
    if n > start:
        group_end[g] = n
        kept[g] = sv >= qfv or st >= qft
        g += 1
    return g


@njit(cache=True)
def _nb_isf_round(lo, q, qf, group_end, kept):
    """One ISF round over samples in their (already shuffled) order: ``lo[k]`` are the loads of
    the k-th sample in that order (one column per phase), so the pass reads memory sequentially.

    Sampling stage (OmniBal Alg. 1): add samples to the current group; when a sample would push
    the group over any phase's cap ``q``, close the group and start a new one with it.
    Filtering stage (Alg. 2): keep a group when it reaches any phase's target ``qf``; other
    groups dissolve and their samples stay for the next round.

    Writes ``group_end[g]`` (exclusive end of group g in the order) and ``kept[g]``; returns the
    number of groups.
    """
    n = lo.shape[0]
    k = q.shape[0]
    if k == 2:
        return _round_two(lo, q[0], q[1], qf[0], qf[1], group_end, kept)
    sums = np.zeros(k, dtype=np.int64)
    g = 0
    start = 0
    for i in range(n):
        if i > start:
            over = False  # plain loops, no early exit: LLVM keeps them tight (5x faster)
            for j in range(k):
                if sums[j] + lo[i, j] > q[j]:
                    over = True
            if over:
                group_end[g] = i
                kept[g] = _reaches(sums, qf)
                g += 1
                start = i
                for j in range(k):
                    sums[j] = 0
        for j in range(k):
            sums[j] += lo[i, j]
    if n > start:
        group_end[g] = n
        kept[g] = _reaches(sums, qf)
        g += 1
    return g


@njit(cache=True)
def _close(open_ids, slot, n_open):
    for s in range(slot + 1, n_open):
        open_ids[s - 1] = open_ids[s]
    return n_open - 1


@njit(cache=True)
def _nb_best_fit(order, loads, q, window, group_of):
    """Pack samples ``order`` (largest first) best-fit into new groups under every cap ``q``.

    A sample goes to the open group it fills most (least slack left, summed over the phases in
    cap-normalized units) among those it fits in; else it opens a group. Only the ``window``
    most recently opened groups stay open (bounded-space best fit: O(n * window)), and a group
    that cannot take even the smallest load of some phase closes early. Writes ``group_of``;
    returns the group count.
    """
    n = order.shape[0]
    k = q.shape[0]
    sums = np.zeros((n, k), dtype=np.int64)
    open_ids = np.empty(window, dtype=np.int64)
    smallest = np.zeros(k, dtype=np.int64)
    if n:
        for j in range(k):
            smallest[j] = loads[order[0], j]
    for s in range(n):
        for j in range(k):
            smallest[j] = min(smallest[j], loads[order[s], j])
    n_open = 0
    ng = 0
    for s in range(n):
        i = order[s]
        best = -1
        best_slot = -1
        best_slack = k + 1.0
        for slot in range(n_open):
            g = open_ids[slot]
            fits = True
            slack = 0.0
            for j in range(k):
                left = q[j] - sums[g, j] - loads[i, j]
                fits = fits and left >= 0
                slack += left / q[j]
            if fits and slack < best_slack:
                best_slack = slack
                best = g
                best_slot = slot
        if best < 0:
            if n_open == window:  # close the oldest open group
                n_open = _close(open_ids, 0, n_open)
            best = ng
            ng += 1
            open_ids[n_open] = best
            best_slot = n_open
            n_open += 1
        full = False
        for j in range(k):
            sums[best, j] += loads[i, j]
            full = full or sums[best, j] + smallest[j] > q[j]
        group_of[i] = best
        if full:
            n_open = _close(open_ids, best_slot, n_open)
    return ng


@njit(cache=True)
def _nb_apply_round(oi, lo, group_end, kept, g, base, group_of, ri, rl):
    """Give kept groups of a round ids ``base, base+1, ...`` (``group_of[oi[k]]``); copy the
    other samples (index ``oi``, loads ``lo``) to ``ri``/``rl`` in order (``ri``/``rl`` may be
    ``oi``/``lo`` themselves: each is written at or before the place it is read from).
    Returns (kept groups, samples in rest)."""
    k = lo.shape[1]
    start = 0
    nk = 0
    nr = 0
    for p in range(g):
        end = group_end[p]
        if kept[p]:
            for i in range(start, end):
                group_of[oi[i]] = base + nk
            nk += 1
        else:
            for i in range(start, end):
                ri[nr] = oi[i]
                if k == 2:  # the common case unrolled: a fifth faster
                    rl[nr, 0] = lo[i, 0]
                    rl[nr, 1] = lo[i, 1]
                else:
                    for j in range(k):
                        rl[nr, j] = lo[i, j]
                nr += 1
        start = end
    return nk, nr
