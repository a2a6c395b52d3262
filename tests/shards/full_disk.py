"""A disk that fills up while the writer writes a shard (the tests' stand-in for ENOSPC)."""

from __future__ import annotations

import errno


class FullDisk:
    """Wraps a shard's open file: every write fails with ENOSPC, the rest passes through."""

    def __init__(self, f):
        self._f = f

    def write(self, b):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)
