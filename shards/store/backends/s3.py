"""A generation in an S3 API object store (AWS, MinIO, Ceph RGW, R2...), through s3fs."""

from __future__ import annotations

from shards.store.backends.base import Sink, StoreBackend, store_size
from shards.store.store_limits import s3_get, s3_list

__all__ = ["S3Backend"]


class S3Backend(StoreBackend):
    """GETs and listings of our own (:func:`~shards.store.store_limits.s3_get`,
    :func:`~shards.store.store_limits.s3_list`: s3fs takes a response whole and follows a
    listing without end), and the conditional PUT that makes ``CURRENT`` move only from the
    generation a night started from (``If-Match`` its ETag, ``If-None-Match: *`` for none)."""

    kind = "s3"
    protocols = frozenset({"s3", "s3a"})
    conditional_put = True

    def get(
        self, path: str, limit: int, sink: Sink, offset: int | None = None, expect=None
    ) -> int | None:
        return s3_get(self.fs, path, limit, sink, offset, expect)

    def list_sizes(self, root: str, location: str, limit: int) -> dict[str, int]:
        found = s3_list(self.fs, location, limit)
        return {k: store_size(v, f"{location.rstrip('/')}/{k}", True) for k, v in found.items()}

    def put(self, path: str, data: bytes, where: str, expect: tuple | None = None) -> None:
        """``OSError`` (the store's 412) when ``expect=(name, tag)`` no longer holds."""
        if expect is None:
            self.call("pipe_file", path, data, where=where)
            return
        _, tag = expect
        cond = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
        self.call("pipe_file", path, data, where=where, **cond)
