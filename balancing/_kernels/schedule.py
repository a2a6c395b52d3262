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
