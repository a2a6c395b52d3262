"""A read-only window of an open file: a tar member read in place, without copying it out."""

from __future__ import annotations

__all__ = ["FileWindow"]


class FileWindow:
    """A read-only view of ``size`` bytes at ``offset`` of an open file (a tar member)."""

    def __init__(self, f, offset: int, size: int) -> None:
        self._f, self._offset, self._size, self._pos = f, offset, size, 0

    def read(self, n: int = -1) -> bytes:
        left = self._size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        self._f.seek(self._offset + self._pos)
        data = self._f.read(n)
        self._pos += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos
