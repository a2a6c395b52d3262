"""One pass over a shard that gives its sha256 and, from the same bytes, the sha256 of each
group's byte range.

A shard is checked whole against its manifest once, and its groups are read again later, one
range at a time (the loader with ``verify=True``, a nightly rebalance copying kept groups). A
file changed in between (rewritten in place, swapped by another job, a cache file replaced)
would then hand over bytes nobody checked. With the ranges' digests taken from the very bytes
that matched the manifest, every later read is compared with them: the bytes used are the
bytes verified.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

__all__ = ["RangeDigests", "hash_file", "hash_fileobj", "range_sha256"]

BLOCK = 8 << 20


class RangeDigests:
    """sha256 of everything fed to :meth:`update`, and of each ``(offset, length)`` range of
    it (ranges may touch or overlap; one past the end keeps the digest of what it got)."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._whole = hashlib.sha256()
        self._ranges = sorted({(int(o), int(n)) for o, n in ranges})
        self._hashes = [hashlib.sha256() for _ in self._ranges]
        self._pos = 0
        self._first = 0  # ranges before this one ended before the bytes fed so far

    def update(self, block: bytes) -> None:
        self._whole.update(block)
        start, end = self._pos, self._pos + len(block)
        view = memoryview(block)
        ranges, hashes = self._ranges, self._hashes
        i = self._first
        while i < len(ranges) and ranges[i][0] < end:
            off, n = ranges[i]
            lo, hi = max(off, start), min(off + n, end)
            if lo < hi:
                hashes[i].update(view[lo - start : hi - start])
            i += 1
        while self._first < len(ranges) and sum(ranges[self._first]) <= end:
            self._first += 1
        self._pos = end

    def hexdigest(self) -> str:
        return self._whole.hexdigest()

    def ranges(self) -> dict[tuple[int, int], bytes]:
        """``{(offset, length): sha256 of those bytes}`` (raw 32-byte digests)."""
        return {r: h.digest() for r, h in zip(self._ranges, self._hashes, strict=True)}


def hash_file(
    path: str | os.PathLike, ranges: Iterable[tuple[int, int]] = (), size: int | None = None
) -> tuple[str, dict[tuple[int, int], bytes]]:
    """(sha256 of the file, sha256 of each range of it), in one read of the file. With
    ``size`` (what the manifest records), at most one byte more is read: a longer file is an
    ``OSError``."""
    with open(path, "rb") as f:
        return hash_fileobj(f, path, ranges, size)


def hash_fileobj(
    f, where, ranges: Iterable[tuple[int, int]] = (), size: int | None = None
) -> tuple[str, dict[tuple[int, int], bytes]]:
    """:func:`hash_file` of a binary file already open (``where`` names it in errors)."""
    h = RangeDigests(ranges)
    _hash_stream(f, h, str(where), size)
    return h.hexdigest(), h.ranges()


def _hash_stream(f, h: RangeDigests, where: str, size: int | None = None) -> None:
    """Feed the binary stream ``f`` to ``h`` to its end, or, with ``size``, to one byte past
    it: a file that holds more than its manifest records (replaced or grown since) is an
    ``OSError`` naming it, never read whole."""
    got = 0
    while size is None or got <= size:
        block = f.read(BLOCK if size is None else min(BLOCK, size + 1 - got))
        if not block:
            return
        h.update(block)
        got += len(block)
    raise OSError(f"{where}: more than the {size} bytes recorded for it")


def range_sha256(data: bytes) -> bytes:
    """The raw sha256 of one range's bytes, as :meth:`RangeDigests.ranges` gives it."""
    return hashlib.sha256(data).digest()
