"""A generation served by a plain HTTP(S) server: read-only, no listing."""

from __future__ import annotations

from shards.store.backends.base import Sink, StoreBackend
from shards.store.store_limits import http_get

__all__ = ["HttpBackend"]


class HttpBackend(StoreBackend):
    """Ranged GETs of our own (:func:`~shards.store.store_limits.http_get`: a deadline sized
    from the object, at most one byte past the limit; fsspec's reads take each response
    whole). A server has no listing (fsspec's ``find`` crawls index pages without end), no
    atomic overwrite and no deletion: a generation is published elsewhere and served here."""

    kind = "http"
    protocols = frozenset({"http", "https"})
    listable = False

    def get(
        self, path: str, limit: int, sink: Sink, offset: int | None = None, expect=None
    ) -> int | None:
        return http_get(self.fs, path, limit, sink, offset, expect)

    def list_sizes(self, root: str, location: str, limit: int) -> dict[str, int]:
        raise ValueError(f"{location}: an HTTP(S) server gives no listing of its files")

    def put(self, path: str, data: bytes, where: str, expect: tuple | None = None) -> None:
        raise ValueError(
            f"{where}: an HTTP(S) server is read-only to equishard (no listing, no atomic "
            "CURRENT); write to a directory or an object store (s3://...) and serve that over HTTP"
        )
