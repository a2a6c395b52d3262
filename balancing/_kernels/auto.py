"""``auto``'s second opinions on a small step, in one kernel call: after refined LPT stopped above
the tolerance and above the lower bound (:func:`_nb_lower_bound`), equal-count Karmarkar-Karp,
the items kept on their own ranks up to the mean, and unequal Karmarkar-Karp, each refined with
moves; the most even kept. One call instead of a dozen: on steps of 32-256 items the calls'
own overhead was most of the time. Plain-Python twins: ``balancing.twins.lower_bound`` and
``balancing.twins.second_opinion``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balancing._kernels.partition import _nb_karmarkar_karp
from balancing._kernels.placement import _nb_local_first
from balancing._kernels.refine import _nb_refine

# what _nb_second_opinion returns: which plan is the most even (KEPT: the caller's own)
KEPT, KK_EQUAL, HOME, KK = 0, 1, 2, 3


@njit(cache=True)
def _nb_lower_bound(lengths, order, d):
    """A load no plan's heaviest of ``d`` batches is below: the mean, the largest item, and for
    each k the k + 1 lightest of the k * d + 1 heaviest items (k + 1 of them share a batch).
    Every sum is taken heaviest first, one item after another."""
    n = order.shape[0]
    if n == 0:
        return 0.0
    cs = np.zeros(n + 1)
    for k in range(n):
        cs[k + 1] = cs[k] + lengths[order[k]]
    lb = max(cs[n] / d, lengths[order[0]])
    for k in range(1, (n - 1) // d + 1):
        lb = max(lb, cs[k * d + 1] - cs[k * d - k])
    return lb


@njit(cache=True)
def _nb_second_opinion(lengths, order, d, target, steps, kk, top, dest):
    """The most even of the second opinions where one beats ``top`` (the caller's heaviest
    batch): ``(code, loads, tried)``, its plan written to ``dest``; ``KEPT`` with empty loads
    (``dest`` untouched) where none does. Each after the first is tried only while the best so
    far is above ``target``; ``kk``: unequal Karmarkar-Karp too (its d-wide merges cost n x d).
    ``tried``: a bit for each opinion that ran (``1 << code``)."""
    n = order.shape[0]
    code, tried = KEPT, 0
    best = np.empty(0)
    cand = np.zeros(n, dtype=np.int64)
    _nb_karmarkar_karp(lengths, order, d, True, cand)  # equal counts, then refined with moves
    loads = _nb_refine(lengths, order, cand, d, target, steps, 0.0, lengths, 0, True)
    tried |= 1 << KK_EQUAL
    if loads.max() < top:
        code, best, top = KK_EQUAL, loads, loads.max()
        dest[:] = cand
    if top > target:  # the items kept where they are up to the mean, refined
        src = (np.arange(n) * d) // n  # the ranks' items one after another
        home = np.empty(n, dtype=np.int64)
        _nb_local_first(lengths, order, src, d, d, target, home)
        loads = _nb_refine(lengths, order, home, d, target, steps, 0.0, lengths, 0, True)
        tried |= 1 << HOME
        if loads.max() < top:
            code, best, top = HOME, loads, loads.max()
            dest[:] = home
    if kk and top > target:
        cand = np.zeros(n, dtype=np.int64)
        _nb_karmarkar_karp(lengths, order, d, False, cand)
        loads = np.zeros(d)
        for i in range(n):  # as np.bincount adds them: in index order
            loads[cand[i]] += lengths[i]
        if loads.max() > target:
            loads = _nb_refine(lengths, order, cand, d, target, steps, 0.0, lengths, 0, True)
        tried |= 1 << KK
        if loads.max() < top:
            code, best = KK, loads
            dest[:] = cand
    return code, best, tried
