"""Which rows of a string column repeat a value: the cost table's duplicate-``sample_id`` check.

At 10M ids, ``pyarrow.compute.value_counts`` took 5-9 s of ``equishard balance`` on 2 cores.
The kernel here makes one pass over the column's own buffers (offsets and bytes, no Python
strings): each id is hashed (FNV-1a, then a 64-bit finalizer) into an open-addressing table of
row numbers, and a slot already taken is compared byte for byte, so the answer is exact
whatever the hash does. :func:`repeated_reference` is its plain-Python twin.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
from numba import njit

__all__ = ["repeated_mask", "repeated_reference"]


@njit(cache=True, nogil=True)  # nogil: balance runs it beside the build, in a thread
def _nb_repeated(offsets, data, valid, table, tags):
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
        h = np.uint64(14695981039346656037)
        for k in range(a, b):
            h = (h ^ np.uint64(data[k])) * np.uint64(1099511628211)
        h ^= h >> np.uint64(33)  # finalizer: ids that differ in one digit land far apart
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
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


def _buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets as int64, bytes as uint8, validity) of a string or large_string array."""
    wide = pa.types.is_large_string(arr.type)
    _, offsets, data = arr.buffers()
    offsets = np.frombuffer(offsets, np.int64 if wide else np.int32)
    offsets = offsets[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
    else:
        valid = np.ones(len(arr), np.bool_)
    return offsets, data, valid


def repeated_mask(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean per row: its id is not null and another row holds the same one."""
    if isinstance(ids, pa.ChunkedArray) and ids.num_chunks == 1:
        ids = ids.chunk(0)
    elif isinstance(ids, pa.ChunkedArray):
        try:
            ids = ids.combine_chunks()
        except pa.ArrowInvalid:  # over 2 GiB of ids: 64-bit offsets
            ids = ids.cast(pa.large_string()).combine_chunks()
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        raise TypeError(f"repeated_mask takes a string column, got {ids.type}")
    if len(ids) == 0:
        return np.zeros(0, bool)
    # a load of at most two thirds: 134 MB of slots at 10M rows (268 MB at one half), probed
    # past a taken slot mostly by its tag alone
    cap = 1 << max(4, (len(ids) + len(ids) // 2).bit_length())
    table = np.full(cap, -1, np.int32 if len(ids) < 2**31 else np.int64)
    return _nb_repeated(*_buffers(ids), table, np.zeros(cap, np.uint32))


def repeated_reference(ids: list[str | None]) -> np.ndarray:
    """The same with a Counter over Python strings (the kernel's twin in the tests)."""
    counts = Counter(x for x in ids if x is not None)
    return np.array([x is not None and counts[x] > 1 for x in ids], dtype=bool)
