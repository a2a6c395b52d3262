"""One class per kind of store a generation can live in: what every read, listing and publish
of :class:`~shards.store.storage.GenerationFiles` asks of the store, and nothing else.

:class:`~shards.store.backends.base.StoreBackend` is any fsspec store (``gs://``, ``az://``,
``memory://``): fsspec's calls, each with a deadline. :class:`LocalBackend` is a directory;
:class:`HttpBackend` a plain HTTP(S) server (ranged GETs of its own, no listing, read-only);
:class:`S3Backend` an S3 API store (bounded GETs and listings of its own, a conditional PUT of
``CURRENT``). A new kind is one module: a subclass naming its fsspec ``protocols``, passed to
:func:`register_backend`. Caching, verification against the manifest and the generation's
layout stay in ``GenerationFiles``, the same for every kind.
"""

from shards.store.backends.base import StoreBackend
from shards.store.backends.http import HttpBackend
from shards.store.backends.local import LocalBackend
from shards.store.backends.registry import backend_for, register_backend, registered
from shards.store.backends.s3 import S3Backend

__all__ = [
    "HttpBackend",
    "LocalBackend",
    "S3Backend",
    "StoreBackend",
    "backend_for",
    "register_backend",
    "registered",
]
