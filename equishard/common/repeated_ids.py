"""Which rows of a string column repeat a value: the cost table's duplicate-``sample_id`` check.

At 10M ids, ``pyarrow.compute.value_counts`` took 5-9 s of ``equishard balance`` on 2 cores:
columns of more than :data:`SMALL` rows go through a numba kernel
(:mod:`equishard.common.repeated_ids_kernel`, one pass over the column's buffers); smaller ones through
pyarrow's ``value_counts`` (milliseconds there, and no numba import or kernel load, which cost a
small ``equishard write`` ~0.65 s). :func:`repeated_reference` is the plain-Python twin of both.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "SMALL",
    "id_hash_reference",
    "repeated_mask",
    "repeated_mask_arrow",
    "repeated_mask_numba",
    "repeated_reference",
]

SMALL = 250_000  # rows; pyarrow's value_counts takes ~0.1 s here, numba's start ~0.65 s


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


def _one_array(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(ids, pa.ChunkedArray) and ids.num_chunks == 1:
        ids = ids.chunk(0)
    elif isinstance(ids, pa.ChunkedArray):
        try:
            ids = ids.combine_chunks()
        except pa.ArrowInvalid:  # over 2 GiB of ids: 64-bit offsets
            ids = ids.cast(pa.large_string()).combine_chunks()
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        raise TypeError(f"repeated_mask takes a string column, got {ids.type}")
    return ids


def repeated_mask(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean per row: its id is not null and another row holds the same one."""
    ids = _one_array(ids)
    return repeated_mask_arrow(ids) if len(ids) <= SMALL else repeated_mask_numba(ids)


def repeated_mask_numba(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`repeated_mask` through the numba kernel, whatever the size."""
    from equishard.common.repeated_ids_kernel import nb_repeated

    ids = _one_array(ids)
    if len(ids) == 0:
        return np.zeros(0, bool)
    # a load of at most two thirds: 134 MB of slots at 10M rows (268 MB at one half), probed
    # past a taken slot mostly by its tag alone
    cap = 1 << max(4, (len(ids) + len(ids) // 2).bit_length())
    table = np.full(cap, -1, np.int32 if len(ids) < 2**31 else np.int64)
    return nb_repeated(*_buffers(ids), table, np.zeros(cap, np.uint32))


def repeated_mask_arrow(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`repeated_mask` through pyarrow: the values counted more than once, looked up per
    row (nulls are never repeats)."""
    ids = _one_array(ids)
    counts = pc.value_counts(ids)
    dup = counts.filter(pc.greater(counts.field("counts"), 1)).field("values").drop_null()
    return np.asarray(pc.fill_null(pc.is_in(ids, value_set=dup), False), dtype=bool)


def id_hash_reference(value: bytes) -> int:
    """``repeated_ids_kernel.nb_id_hashes``' hash of one id's bytes in plain Python."""
    m = (1 << 64) - 1
    h = 14695981039346656037
    for byte in value:
        h = ((h ^ byte) * 1099511628211) & m
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & m
    h ^= h >> 33
    return h


def repeated_reference(ids: list[str | None]) -> np.ndarray:
    """The same with a Counter over Python strings (the kernel's twin in the tests)."""
    counts = Counter(x for x in ids if x is not None)
    return np.array([x is not None and counts[x] > 1 for x in ids], dtype=bool)
