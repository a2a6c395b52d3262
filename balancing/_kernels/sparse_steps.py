"""Clearing a phase out of the steps that hold only a little of it. Where a phase's groups with
and without it meet in the step order (recordings only beside groups with images, say), a step
may carry the phase on only some of its groups: it is among the most uneven steps of the plan in
that phase, and no move inside the step helps (a group's one image only changes places). Such a
step, when its dist ratio in the phase passes :data:`CLEAR_ABOVE`, sends each of its items of the
phase to another step where every group carries the phase, to that step's lightest group in the
phase where the item passes no cap and raises none of that step's largest loads (so the
receiving step only grows more even); the step is left without the phase: even in it. A step is
cleared whole or not at all (a partly cleared step is more uneven than before), and the short
last step (a group without samples) stays as it is; a group keeps at least one sample and every
other phase it has. Plain-Python twin: ``balancing._reference.clear_sparse``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# the dist ratio in a phase past which a step lacking the phase on some groups is cleared of it:
# a step with a quarter of its groups without the phase, or worse (below it, moving the items
# would cost more than it gains)
CLEAR_ABOVE = 0.25


@njit(cache=True)
def _tables(x, group_of, by_step, n_groups):
    """Each group's step, loads and sample count; each step's count of groups carrying each
    phase and its largest load in each."""
    n, k = x.shape
    n_steps, d = by_step.shape
    step_of = np.full(n_groups, -1, dtype=np.int64)
    for s in range(n_steps):
        for r in range(d):
            step_of[by_step[s, r]] = s
    loads = np.zeros((n_groups, k))
    count = np.zeros(n_groups, dtype=np.int64)
    for i in range(n):
        count[group_of[i]] += 1
        for p in range(k):
            loads[group_of[i], p] += x[i, p]
    nonzero = np.zeros((n_steps, k), dtype=np.int64)
    top = np.zeros((n_steps, k))
    for s in range(n_steps):
        _recount(s, by_step, loads, nonzero, top)
    return step_of, loads, count, nonzero, top


@njit(cache=True)
def _recount(s, by_step, loads, nonzero, top):
    """Step ``s``'s count of groups carrying each phase and its largest loads, as they are."""
    for p in range(loads.shape[1]):
        nonzero[s, p] = 0
        top[s, p] = 0.0
        for r in range(by_step.shape[1]):
            v = loads[by_step[s, r], p]
            nonzero[s, p] += v > 0
            top[s, p] = max(top[s, p], v)


@njit(cache=True)
def _sparse(s, j, by_step, loads, count, nonzero, top):
    """True where step ``s`` is to be cleared of phase ``j`` (see the module)."""
    d = by_step.shape[1]
    if nonzero[s, j] == 0 or nonzero[s, j] == d:
        return False
    held = 0.0
    for r in range(d):
        if count[by_step[s, r]] == 0:
            return False
        held += loads[by_step[s, r], j]
    return 1.0 - held / (top[s, j] * d) > CLEAR_ABOVE


@njit(cache=True)
def _receiver(x, i, j, q, by_step, loads, nonzero, top, skip, start):
    """The (step, group) that takes sample ``i`` out of a step cleared of phase ``j``: the first
    step from ``start`` on (in turn; not ``skip``) whose groups all carry ``j``, at its lightest
    group in ``j`` (the first on a tie) that the sample joins under every cap (or no further past
    one) and under the step's largest load in every phase; (-1, -1) when no step has one."""
    n_steps, d = by_step.shape
    for t in range(n_steps):
        s = (start + t) % n_steps
        if s == skip or nonzero[s, j] < d:
            continue
        best = -1
        for r in range(d):
            g = by_step[s, r]
            fits = True
            for p in range(x.shape[1]):
                new = loads[g, p] + x[i, p]
                if x[i, p] > 0 and (new > max(q[p], loads[g, p]) or new > top[s, p]):
                    fits = False
            if fits and (best < 0 or loads[g, j] < loads[best, j]):
                best = g
        if best >= 0:
            return s, best
    return -1, -1


@njit(cache=True)
def _shift(x, i, g, g2, group_of, step_of, by_step, loads, count, nonzero, top):
    """Move sample ``i`` from group ``g`` to group ``g2``; the tables follow."""
    for p in range(x.shape[1]):
        loads[g, p] -= x[i, p]
        loads[g2, p] += x[i, p]
    count[g] -= 1
    count[g2] += 1
    group_of[i] = g2
    _recount(step_of[g], by_step, loads, nonzero, top)
    _recount(step_of[g2], by_step, loads, nonzero, top)


@njit(cache=True)
def _nb_clear_sparse(x, group_of, by_step, q, n_groups):
    """Clear every step that holds only a little of a phase (see the module), phases in order,
    steps in order, the receiving steps taken in turn after the last one used. ``x`` (n, k): the
    samples' loads; ``group_of``: their groups (updated in place); ``by_step`` (steps, D): each
    step's groups; ``q``: each phase's cap; ``n_groups``: a bound of the group ids. Returns the
    samples moved."""
    n, k = x.shape
    step_of, loads, count, nonzero, top = _tables(x, group_of, by_step, n_groups)
    moved_i = np.empty(n, dtype=np.int64)
    moved_from = np.empty(n, dtype=np.int64)
    total = 0
    start = 0
    for j in range(k):
        step = step_of[group_of]  # the samples by step, as the phases before left them
        members = np.argsort(step, kind="mergesort")
        first = np.searchsorted(step[members], np.arange(by_step.shape[0] + 1))
        for s in range(by_step.shape[0]):
            if not _sparse(s, j, by_step, loads, count, nonzero, top):
                continue
            m = 0
            cleared = True
            for pos in range(first[s], first[s + 1]):
                i = members[pos]
                g = group_of[i]
                if x[i, j] == 0:
                    continue
                kept = count[g] > 1  # the group keeps a sample and every other phase it has
                for p in range(k):
                    if p != j and x[i, p] > 0 and loads[g, p] - x[i, p] <= 0:
                        kept = False
                s2, g2 = -1, -1
                if kept:
                    s2, g2 = _receiver(x, i, j, q, by_step, loads, nonzero, top, s, start)
                if s2 < 0:
                    cleared = False
                    break
                _shift(x, i, g, g2, group_of, step_of, by_step, loads, count, nonzero, top)
                moved_i[m] = i
                moved_from[m] = g
                m += 1
                start = s2 + 1
            if cleared:
                total += m
                continue
            for t in range(m - 1, -1, -1):  # the step keeps its items: undone, last first
                i = moved_i[t]
                back = moved_from[t]
                _shift(
                    x, i, group_of[i], back, group_of, step_of, by_step, loads, count, nonzero, top
                )
    return total
