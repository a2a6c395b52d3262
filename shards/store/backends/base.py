"""The store backend contract, and its implementation for any fsspec store.

A backend answers for paths in the store's own terms (``full_path`` of a
:class:`~shards.store.storage.GenerationFiles`); ``where`` is the location named in messages.
Every call has a deadline (:func:`~shards.store.store_limits.store_call`); a read hands at most
one byte past its limit to its sink, so a store that streams without end never fills memory.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import ClassVar

from shards.store.store_limits import store_call

__all__ = ["StoreBackend", "pump", "store_size"]

Sink = Callable[[bytes], object]
_BLOCK = 8 << 20


def store_size(value, where: str, listed: bool = False) -> int | None:
    """A size as a store reported it, checked where it enters: a whole number of bytes >= 0
    (None where a single object's size is unknown, as plain HTTP may give); a listing's
    missing, negative or non-numeric size is a ``ValueError`` naming the object."""
    if value is None and not listed:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{where}: the store reports a size of {value!r}, not a number of bytes")
    return int(value)


def pump(f, limit: int, sink: Sink) -> int:
    """Hand the open file ``f`` from where it stands to ``sink`` in blocks, one byte past
    ``limit`` at most; the bytes handed over (a stream's read may return less than asked
    before its end)."""
    got = 0
    while got <= limit:
        part = f.read(min(limit + 1 - got, _BLOCK))
        if not part:
            break
        sink(part)
        got += len(part)
    return got


class StoreBackend:
    """Any fsspec store, through fsspec's own calls. Subclasses name the ``protocols`` they
    serve and override what their store does better (a bounded GET, a listing, a conditional
    write)."""

    kind: ClassVar[str] = "fsspec"
    protocols: ClassVar[frozenset[str]] = frozenset()  # empty: the fallback for any store
    listable: ClassVar[bool] = True  # one listing gives every file's size
    conditional_put: ClassVar[bool] = False  # put(..., expect=) moves an object only if unmoved
    remote: ClassVar[bool] = True

    def __init__(self, fs) -> None:
        self.fs = fs

    def call(self, method: str, *args, where: str, nbytes: int = 0, **kw):
        """One fsspec call with a deadline."""
        return store_call(self.fs, method, *args, where=where, nbytes=nbytes, **kw)

    # -- single objects -------------------------------------------------------------------
    def exists(self, path: str, where: str) -> bool:
        return self.call("exists", path, where=where)

    def is_dir(self, path: str, where: str) -> bool:
        return self.call("isdir", path, where=where)

    def size(self, path: str, where: str) -> int | None:
        """The object's size (None where the store does not say); ``FileNotFoundError``."""
        return store_size(self.call("size", path, where=where), where)

    def get(
        self, path: str, limit: int, sink: Sink, offset: int | None = None, expect=None
    ) -> int | None:
        """One bounded GET of the store's own, handing what the store sends to ``sink`` (at most
        ``limit + 1`` bytes: one past the limit shows a store sending more) and returning how
        many: with ``offset``, the range ``offset..offset+limit``; without, the object from its
        start. None where the backend has none (fsspec's reads are used)."""
        return None

    def stream(self, path: str, limit: int, sink: Sink, expect: int | None = None) -> int:
        """Hand ``path`` from its start to ``sink``, one byte past ``limit`` at most; the bytes
        handed over. ``expect``: the size the store reported, which sizes the deadline."""
        got = self.get(path, limit, sink, expect=expect)
        if got is not None:
            return got
        with self.fs.open(path, "rb", block_size=_BLOCK) as f:
            return pump(f, limit, sink)

    def read_range(self, path: str, offset: int, length: int, where: str) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end); ``OSError`` when the store
        sends more (a server that ignores byte ranges sends the whole object)."""
        parts: list[bytes] = []
        if self.get(path, length, parts.append, offset) is not None:
            data = b"".join(parts)
        else:
            data = self.call(
                "cat_file", path, start=offset, end=offset + length, where=where, nbytes=length
            )
        if len(data) > length:
            raise OSError(
                f"{where}: asked for bytes {offset}+{length}, the server sent more: it ignores "
                "byte ranges (HTTP Range); serve the generation from a server or store that "
                "supports them (every object store does)"
            )
        return data

    def read_small(self, path: str, limit: int, where: str) -> bytes:
        """The whole of a small object of at most ``limit`` bytes (``ValueError`` when larger,
        ``FileNotFoundError`` when absent), never more than one byte past the limit read."""
        size = self.size(path, where)
        if size is not None and size > limit:
            raise ValueError(f"{where}: {size} bytes, more than the {limit} it may hold")
        # the size a store reports may be missing or stale: read one byte past the limit at most
        parts: list[bytes] = []
        self.stream(path, limit, parts.append, expect=size)  # the deadline is the object's
        data = b"".join(parts)
        if len(data) > limit:
            raise ValueError(f"{where}: more than the {limit} bytes it may hold")
        return data

    # -- listings -------------------------------------------------------------------------
    def list_sizes(self, root: str, location: str, limit: int) -> dict[str, int]:
        """Every object under ``root`` by name relative to it, with its size, in one listing;
        ``OSError`` when the store names more than ``limit``."""
        # listings cached earlier (s3fs keeps one per directory, and drops only a path's
        # parents on invalidation) may name replaced objects: list afresh
        self.fs.invalidate_cache()
        found = self.call("find", root, detail=True, where=location, nbytes=limit * 1024)
        prefix = root.rstrip("/") + "/"
        out = {
            k[len(prefix) :]: store_size(v.get("size") if isinstance(v, dict) else None, k, True)
            for k, v in found.items()
            if k.startswith(prefix)
        }
        if len(out) > limit:
            raise OSError(f"{location}: the store lists more than {limit} objects under it")
        return out

    # -- publishing -----------------------------------------------------------------------
    def put(self, path: str, data: bytes, where: str, expect: tuple | None = None) -> None:
        """Write a small object whole (``CURRENT``). ``expect=(name, tag)`` asks the store to
        write only if the object still has ``tag`` (or, tag None, does not exist): only where
        :attr:`conditional_put`; other stores take one writer per root at a time."""
        if expect is not None and self.conditional_put:
            raise NotImplementedError(f"{type(self).__name__} names conditional_put")
        self.call("pipe_file", path, data, where=where)
