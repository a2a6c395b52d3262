"""Which backend serves a location: the first registered whose protocols meet the fsspec file
system's, else the generic fsspec one; a local path is always :class:`LocalBackend`."""

from __future__ import annotations

from shards.store.backends.base import StoreBackend
from shards.store.backends.http import HttpBackend
from shards.store.backends.local import LocalBackend
from shards.store.backends.s3 import S3Backend

__all__ = ["backend_for", "register_backend", "registered"]

_BACKENDS: list[type[StoreBackend]] = [HttpBackend, S3Backend]


def register_backend(backend: type[StoreBackend]) -> type[StoreBackend]:
    """Serve the stores whose fsspec protocols meet ``backend.protocols`` with ``backend``
    (ahead of those registered before it); returns it, so it can decorate the class."""
    if not (isinstance(backend, type) and issubclass(backend, StoreBackend)):
        raise TypeError(f"{backend!r} is not a StoreBackend subclass")
    if not backend.protocols or not all(isinstance(p, str) and p for p in backend.protocols):
        raise ValueError(f"{backend.__name__} names no protocols (a frozenset of fsspec names)")
    if backend in _BACKENDS:
        _BACKENDS.remove(backend)
    _BACKENDS.insert(0, backend)
    return backend


def registered() -> tuple[type[StoreBackend], ...]:
    """The registered backends in the order they are asked."""
    return tuple(_BACKENDS)


def _protocols(fs) -> frozenset[str]:
    p = fs.protocol
    return frozenset((p,) if isinstance(p, str) else p)


def backend_for(fs) -> StoreBackend:
    """The backend of fsspec file system ``fs`` (None: a local directory)."""
    if fs is None:
        return LocalBackend()
    protocols = _protocols(fs)
    for backend in _BACKENDS:
        if backend.protocols & protocols:
            return backend(fs)
    return StoreBackend(fs)
