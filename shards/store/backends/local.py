"""A generation in a local directory (or any mounted file system)."""

from __future__ import annotations

import os
from pathlib import Path

from equishard.common.local_files import read_small
from shards.store.backends.base import Sink, StoreBackend, pump

__all__ = ["LocalBackend"]


class LocalBackend(StoreBackend):
    """Plain file calls. Writes to a local root go through :mod:`shards.store.publish` (a
    rename under the root's lock), never through :meth:`put`."""

    kind = "local"
    remote = False

    def __init__(self, fs=None) -> None:
        super().__init__(None)

    def exists(self, path: str, where: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str, where: str) -> bool:
        return os.path.isdir(path)

    def size(self, path: str, where: str) -> int | None:
        return os.path.getsize(path)

    def stream(self, path: str, limit: int, sink: Sink, expect: int | None = None) -> int:
        with open(path, "rb") as f:
            return pump(f, limit, sink)

    def read_range(self, path: str, offset: int, length: int, where: str) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def read_small(self, path: str, limit: int, where: str) -> bytes:
        """A regular file's bytes (a FIFO put there would block forever)."""
        return read_small(path, limit)

    def list_sizes(self, root: str, location: str, limit: int) -> dict[str, int]:
        base = Path(root)
        return {str(p.relative_to(base)): p.stat().st_size for p in base.rglob("*") if p.is_file()}

    def put(self, path: str, data: bytes, where: str, expect: tuple | None = None) -> None:
        raise TypeError(
            f"{where}: a local root is published by shards.store.publish (rename under its "
            "lock), not by a backend write"
        )
