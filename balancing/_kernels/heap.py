"""An indexed binary min-heap over (key, value) pairs, shared by the runtime partition kernels:
ranks keyed by load, with each entry's position kept so a changed load is fixed in place.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
