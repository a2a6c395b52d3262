"""The duplicate-``sample_id`` kernel (:mod:`equishard.common.repeated_ids` decides when it runs).

One pass over a string column's own buffers (offsets and bytes, no Python strings): each id is
hashed (FNV-1a, then a 64-bit finalizer) into an open-addressing table of row numbers, and a
slot already taken is compared byte for byte, so the answer is exact whatever the hash does.
In a module of its own so that small tables never import numba (~0.25 s) or load the kernel
(~0.4 s), most of a small ``equishard write``'s start.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["nb_id_hashes", "nb_repeated"]


@njit(cache=True, nogil=True, inline="always")
def _hash(data, a, b):
    """FNV-1a of ``data[a:b]``, then a 64-bit finalizer (ids that differ in one digit land far
    apart); ``repeated_ids.id_hash_reference`` is its twin."""
    h = np.uint64(14695981039346656037)
    for k in range(a, b):
        h = (h ^ np.uint64(data[k])) * np.uint64(1099511628211)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True, nogil=True)
def nb_id_hashes(offsets, data):
    """Every row's hash of its bytes ``data[offsets[i]:offsets[i + 1]]`` (a plan over
    partitions sends each id to the worker its hash names, which finds the repeats among
    them)."""
    n = offsets.shape[0] - 1
    out = np.empty(n, np.uint64)
    for i in range(n):
        out[i] = _hash(data, offsets[i], offsets[i + 1])
    return out


@njit(cache=True, nogil=True)  # nogil: balance runs it beside the build, in a thread
def nb_repeated(offsets, data, valid, table, tags):
    """``out[i]``: row ``i``'s bytes ``data[offsets[i]:offsets[i + 1]]`` equal another valid
    row's. Invalid (null) rows are never repeats. ``table``: -1s, a power of two at least 1.5 times
    the rows (the slots of the rows seen); ``tags``: as long, each slot's hash's high bits (the
    bytes of a slot's row are read only where they agree)."""
    n = offsets.shape[0] - 1
    mask = np.uint64(table.shape[0] - 1)
    out = np.zeros(n, np.bool_)
    for i in range(n):
        if not valid[i]:
            continue
        a, b = offsets[i], offsets[i + 1]
        h = _hash(data, a, b)
        slot = h & mask
        tag = np.uint32(h >> np.uint64(32))
        while True:
            j = table[slot]
            if j < 0:
                table[slot] = i
                tags[slot] = tag
                break
            same = tags[slot] == tag
            if same:
                ja, jb = offsets[j], offsets[j + 1]
                same = jb - ja == b - a
            if same:
                for k in range(b - a):
                    if data[ja + k] != data[a + k]:
                        same = False
                        break
            if same:
                out[i] = True
                out[j] = True
                break
            slot = (slot + np.uint64(1)) & mask
    return out
