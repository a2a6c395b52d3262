"""Pipeline schedule kernel: the 1F1B timeline of a sequence of microbatches over the stages
(MMScale's inter-microbatch reordering scores orders with it).
"""

from __future__ import annotations

import numpy as np
from numba import njit


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


@njit(cache=True)
def _nb_1f1b_ops(p, m):
    """The 2pm ops of a 1F1B pipeline of p stages and m microbatches in an order that respects
    every dependency of ``_nb_1f1b_times`` (its polling order; it depends on neither the times nor
    the microbatch order): (stage, kind 0 forward / 1 backward, position) per op."""
    n_ops = 2 * m
    seq_pos = np.zeros((p, n_ops), dtype=np.int64)
    seq_kind = np.zeros((p, n_ops), dtype=np.int64)
    for s in range(p):
        warm = min(p - s - 1, m)
        k = 0
        for j in range(warm):
            seq_pos[s, k] = j
            k += 1
        for j in range(warm, m):
            seq_pos[s, k] = j
            seq_kind[s, k + 1] = 1
            seq_pos[s, k + 1] = j - warm
            k += 2
        for j in range(m - warm, m):
            seq_kind[s, k] = 1
            seq_pos[s, k] = j
            k += 1
    out_s = np.empty(p * n_ops, dtype=np.int64)
    out_k = np.empty(p * n_ops, dtype=np.int64)
    out_j = np.empty(p * n_ops, dtype=np.int64)
    done_f = np.zeros((p, m), dtype=np.bool_)
    done_b = np.zeros((p, m), dtype=np.bool_)
    ptr = np.zeros(p, dtype=np.int64)
    n = 0
    progressed = True
    while progressed:
        progressed = False
        for s in range(p):
            while ptr[s] < n_ops:
                kind = seq_kind[s, ptr[s]]
                j = seq_pos[s, ptr[s]]
                if kind == 0:
                    if s > 0 and not done_f[s - 1, j]:
                        break
                    done_f[s, j] = True
                else:
                    if s < p - 1 and not done_b[s + 1, j]:
                        break
                    done_b[s, j] = True
                out_s[n] = s
                out_k[n] = kind
                out_j[n] = j
                n += 1
                ptr[s] += 1
                progressed = True
    return out_s, out_k, out_j


@njit(cache=True)
def _nb_makespan(fwd, bwd, order, ops_s, ops_k, ops_j):
    """The last backward's end on the 1F1B timeline of ``_nb_1f1b_times`` (0 for no microbatches),
    in one pass over ``_nb_1f1b_ops(p, m)``."""
    p = fwd.shape[0]
    m = order.shape[0]
    ef = np.zeros((p, m))
    eb = np.zeros((p, m))
    free = np.zeros(p)
    last = 0.0
    for n in range(ops_s.shape[0]):
        s = ops_s[n]
        j = ops_j[n]
        if ops_k[n] == 0:
            ready = ef[s - 1, j] if s > 0 else 0.0
            ef[s, j] = max(free[s], ready) + fwd[s, order[j]]
            free[s] = ef[s, j]
        else:
            ready = eb[s + 1, j] if s < p - 1 else ef[s, j]
            eb[s, j] = max(free[s], ready) + bwd[s, order[j]]
            free[s] = eb[s, j]
            last = max(last, eb[s, j])
    return last


@njit(cache=True)
def _nb_swap_descent(fwd, bwd, order, max_passes, max_evals):
    """Pairwise-swap descent on the 1F1B makespan: pass over the pairs (i < j) of positions in
    order, keep a swap when it shortens the makespan by more than a relative 1e-12; stop after a
    pass that kept none, after ``max_passes`` passes or after ``max_evals`` makespans. Returns
    the new order (a copy)."""
    o = order.copy()
    m = o.shape[0]
    ops_s, ops_k, ops_j = _nb_1f1b_ops(fwd.shape[0], m)
    best = _nb_makespan(fwd, bwd, o, ops_s, ops_k, ops_j)
    evals = 0
    for _ in range(max_passes):
        improved = False
        for i in range(m - 1):
            for j in range(i + 1, m):
                if evals >= max_evals:
                    return o
                evals += 1
                a = o[i]
                o[i] = o[j]
                o[j] = a
                val = _nb_makespan(fwd, bwd, o, ops_s, ops_k, ops_j)
                if val < best - 1e-12 * best:
                    best = val
                    improved = True
                else:
                    o[j] = o[i]
                    o[i] = a
        if not improved:
            break
    return o
