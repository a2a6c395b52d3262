"""Where a generation's bytes are: a local directory, or any fsspec URL (``s3://``, ``gs://``,
``http(s)://``, ...), read by byte range.

:class:`GenerationFiles` is what the manifest loader and the streaming loader read through:
``read_range`` fetches one group's exact bytes (a ranged GET on an object store: a shard is
never downloaded to read a group), ``sha256`` streams a whole shard through the hash, and
``sizes`` lists the generation once (one LIST, not a HEAD per shard). With ``cache_dir``, fetched
bytes are kept on local disk, content-addressed by the shard's sha256 from the manifest, so a
second epoch reads no object twice: a group's range as ``<sha256>/<offset>-<length>``, a shard
verified whole (``verify=True``) as ``<sha256>.tar``, from which its groups are then read.
A shard hashed with its groups' ranges (``sha256(..., ranges=)``) keeps each range's digest from
the bytes that matched, and every later ``read_range`` of it, local, cached or fetched, is
compared with it: the bytes used are the bytes verified, even when the file changed since.
Cache files are written to a temporary name and renamed,
which makes one cache directory safe to share between ranks and DataLoader workers (fsspec's own
``blockcache`` keeps one metadata file per cache that concurrent processes overwrite).

Nothing in the cache is trusted for being there: a cache file's name is built only from a
checked digest (64 lowercase hex characters, so it never leaves the cache directory); a group's
range is stored with the sha256 of its bytes and read back only when they still match; a whole
shard is hashed again on every ``sha256`` call, and its groups are read from it only after it
matched in this process. A damaged cache file is dropped and the bytes fetched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from shards.format.range_digests import RangeDigests, hash_file, hash_fileobj, range_sha256
from shards.store.backends import StoreBackend, backend_for
from shards.store.cache_files import CacheDir
from shards.store.store_limits import (  # re-exported: how store requests are bounded
    bounded_options,
    listing_limit,
    store_limits,
)

__all__ = [
    "GenerationFiles",
    "bounded_options",
    "check_writable",
    "is_url",
    "join_url",
    "sha256_of",
    "store_limits",
]

SMALL_FILE_LIMIT = 1 << 30  # a manifest of millions of groups stays far below


_DIGEST = re.compile(r"[0-9a-f]{64}")
_TRAILER = 32  # a cached range ends with the sha256 (raw bytes) of what precedes it


def _check_digest(sha256: str) -> str:
    if not _DIGEST.fullmatch(sha256):
        raise ValueError(
            f"{sha256[:80]!r} is not a sha256 digest (64 lowercase hex characters); it cannot "
            "name a cache file"
        )
    return sha256


def is_url(location: str | os.PathLike) -> bool:
    """True for ``PROTOCOL://...`` other than ``file://`` (which is read as a local path)."""
    s = os.fspath(location)
    return "://" in s and not s.startswith("file://")


def check_writable(location: str | os.PathLike, what: str) -> None:
    """``ValueError`` for a location equishard cannot publish to: a plain HTTP(S) server
    serves a generation (each group one ranged GET) but has no listing, no atomic overwrite of
    CURRENT and no deletion; a night or write aimed at one failed only at its publish, after
    all its work."""
    if os.fspath(location).lower().startswith(("http://", "https://")):
        raise ValueError(
            f"{what} {location}: an HTTP(S) server is read-only to equishard (no listing, no "
            "atomic CURRENT); write to a directory or an object store (s3://...) and serve "
            "that over HTTP"
        )


def join_url(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def _local(location: str | os.PathLike) -> Path:
    s = os.fspath(location)
    return Path(s[len("file://") :] if s.startswith("file://") else s)


class GenerationFiles:
    """The files of one generation (or generation root) at ``location``."""

    def __init__(
        self,
        location: str | os.PathLike,
        *,
        storage_options: dict | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        self.remote = is_url(location)
        self.storage_options = dict(storage_options or {})
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        # checked where it enters: never one anyone may write without the sticky bit
        self._cache = CacheDir(cache_dir) if cache_dir is not None and is_url(location) else None
        self._fs, self._backend, self._pid = None, None, None
        self._whole_ok: set[str] = set()  # digests of whole cached shards checked in this process
        # shard digest -> {(offset, length): sha256 of that range}, from bytes that matched it
        self._checked: dict[str, dict[tuple[int, int], bytes]] = {}
        if self.remote:
            self.location = os.fspath(location).rstrip("/")
            self._root = self._root_of(self.location)
        else:
            self.location = os.fspath(_local(location))
            self._root = self.location
        self.path = _local(location) if not self.remote else None

    @property
    def fs(self):
        """The fsspec filesystem, made again in a new process: async ones (s3fs, gcsfs) are not
        fork-safe, and DataLoader workers are forked or unpickled copies of the loader."""
        if not self.remote:
            return None
        if self._fs is None or self._pid != os.getpid():
            import fsspec

            opts, retries = bounded_options(self.location, self.storage_options)
            self._fs, _ = fsspec.core.url_to_fs(self.location, **opts)
            if retries is not None:
                self._fs.retries = retries  # s3fs's own retry loop (around botocore's)
            self._pid, self._backend = os.getpid(), None
        return self._fs

    @property
    def backend(self) -> StoreBackend:
        """What this kind of store does for each read, listing and write
        (:mod:`shards.store.backends`): one per file system, made again with it."""
        fs = self.fs
        if self._backend is None or self._backend.fs is not fs:
            self._backend = backend_for(fs)
        return self._backend

    def _root_of(self, location: str) -> str:
        return self.fs._strip_protocol(location)  # the filesystem's path for the URL

    def __getstate__(self) -> dict:
        return {
            **self.__dict__,
            "_fs": None,
            "_backend": None,
            "_pid": None,
            "_whole_ok": set(),
            "_checked": {},
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"GenerationFiles({self.location!r})"

    def child(self, name: str) -> GenerationFiles:
        """The same store one level down (a generation inside a root)."""
        loc = join_url(self.location, name) if self.remote else os.path.join(self.location, name)
        out = GenerationFiles.__new__(GenerationFiles)
        out.__dict__.update(self.__dict__)
        out.location = loc
        out._root = join_url(self._root, name) if self.remote else loc
        out.path = None if self.remote else Path(loc)
        return out

    def where(self, name: str) -> str:
        """The full location of member ``name``, for messages."""
        return join_url(self.location, name) if self.remote else os.path.join(self.location, name)

    def full_path(self, name: str) -> str:
        return join_url(self._root, name) if self.remote else os.path.join(self._root, name)

    # ------------------------------------------------------------------ reading
    def exists(self, name: str) -> bool:
        return self.backend.exists(self.full_path(name), self.where(name))

    def is_dir(self) -> bool:
        return self.backend.is_dir(self._root, self.location)

    def read_bytes(self, name: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
        """The whole of a small file (manifest, CURRENT) of at most ``limit`` bytes: a regular
        file (a FIFO put there would block forever), ``ValueError`` when larger;
        FileNotFoundError if absent."""
        return self.backend.read_small(self.full_path(name), limit, self.where(name))

    def copy_to(self, name: str, target: str | os.PathLike, size: int) -> str:
        """Copy ``name`` to the local file ``target``, reading at most one byte more than
        ``size`` (a larger file is an ``OSError``: a listing's size gone stale, or a store that
        streams without end, never fills the disk); returns the copy's sha256."""
        h = RangeDigests()
        with open(target, "wb") as out:
            self._hash(name, size, h, out)
            out.flush()
            os.fsync(out.fileno())  # on disk before the copy is published by a rename
        return h.hexdigest()

    def _hash(self, name: str, size: int | None, h: RangeDigests, out=None) -> None:
        """Feed remote ``name`` to ``h`` (and ``out``), at most one byte past ``size``: more
        is an ``OSError`` naming it."""

        def feed(part: bytes) -> None:
            h.update(part)
            if out is not None:
                out.write(part)

        limit = (1 << 62) if size is None else size
        if self.backend.stream(self.full_path(name), limit, feed) > limit:
            raise OSError(f"{self.where(name)}: more than the {size} bytes recorded for it")

    def call(self, method: str, *args, where: str, nbytes: int = 0, **kw):
        """One fsspec call with a deadline (the backend's, :meth:`StoreBackend.call`)."""
        return self.backend.call(method, *args, where=where, nbytes=nbytes, **kw)

    @property
    def kind(self) -> str:
        """The kind of store: ``local``, ``http``, ``s3`` or ``fsspec`` (any other fsspec store:
        gs://, az://, memory://), or a registered backend's."""
        return self.backend.kind

    def size(self, name: str, missing: bool = True) -> int | None:
        """The size of one file (None when it does not exist; with ``missing=False``,
        ``FileNotFoundError``; None too where a store does not say, as plain HTTP may)."""
        try:
            return self.backend.size(self.full_path(name), self.where(name))
        except FileNotFoundError:
            if not missing:
                raise
            return None

    def listable(self) -> bool:
        """Whether one listing gives every file's size (object stores, not plain HTTP)."""
        return self.backend.listable

    def sizes(self, files: int) -> dict[str, int]:
        """Size of every file under this location, by name relative to it (one listing), for a
        generation of ``files`` files: a store's listing naming far more objects
        (:func:`~shards.store.store_limits.listing_limit`) is an ``OSError``."""
        return self.backend.list_sizes(self._root, self.location, listing_limit(files))

    def checked(self, sha256: str) -> bool:
        """Whether a shard of this digest was hashed with its ranges in this process."""
        return sha256 in self._checked

    def read_range(self, name: str, offset: int, length: int, sha256: str = "") -> bytes:
        """``length`` bytes of ``name`` from ``offset`` (fewer if the file is shorter).
        ``sha256`` (the shard's digest from the manifest) keys the local cache; when the shard
        was hashed with this range (:meth:`sha256`), the bytes must equal the ones hashed then,
        else ``OSError``."""
        data = self._read_range(name, offset, length, sha256)
        known = self._checked.get(sha256, {}).get((offset, length)) if sha256 else None
        if known is None or range_sha256(data) == known:
            return data
        if self._drop_cached(sha256, offset, length):  # a cached copy changed: ask the store
            data = self._read_range(name, offset, length, sha256)
        if range_sha256(data) != known:
            raise OSError(
                f"{self.where(name)}: bytes {offset}+{length} are not the ones checked against "
                "the manifest's sha256 earlier in this process: the shard changed after it was "
                "verified"
            )
        return data

    def _read_range(self, name: str, offset: int, length: int, sha256: str) -> bytes:
        cache = self._cache_names(sha256, offset, length) if self.remote else None
        if cache is not None:
            whole, (sub, part) = cache
            f = self._cache.open_read(whole) if sha256 in self._whole_ok else None
            if f is not None:  # hashed whole in this process
                with f:
                    f.seek(offset)
                    return f.read(length)
            hit = self._read_part(sub, part, length)
            if hit is not None:
                return hit
        data = self.backend.read_range(self.full_path(name), offset, length, self.where(name))
        if cache is not None and len(data) == length:
            with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
                self._cache.write(part, data + hashlib.sha256(data).digest(), sub)
        return data

    def sha256(
        self,
        name: str,
        expected: str = "",
        ranges: Iterable[tuple[int, int]] = (),
        size: int | None = None,
    ) -> str:
        """The sha256 of ``name``, streamed. Remote with a cache directory: the shard is kept
        there when it matches ``expected`` (its groups are then read from that copy). When it
        matches, the digests of ``ranges`` (its groups' byte ranges) taken in the same pass
        are kept, and :meth:`read_range` checks those ranges against them from then on.
        ``size`` (the manifest's): a file with more bytes is an ``OSError`` after one more is
        read (a store that streams without end would otherwise be hashed forever)."""
        if not self.remote:
            digest, parts = hash_file(self.full_path(name), ranges, size)
            return self._matched(digest, expected, parts)
        keep = self._cache is not None and expected
        whole = f"{_check_digest(expected)}.tar" if keep else None
        f = self._cache.open_read(whole) if whole is not None else None
        if f is not None:
            # a cache hit is checked like a fresh fetch: hashed again, dropped when it differs
            with f:
                try:
                    digest, parts = hash_fileobj(f, self._cache.path / whole, ranges, size)
                except OSError:  # longer than the manifest says
                    digest = ""
            if digest == expected:
                self._whole_ok.add(expected)
                return self._matched(digest, expected, parts)
            self._cache.remove(whole)
        h = RangeDigests(ranges)
        with contextlib.ExitStack() as stack:
            out = publish = None
            if whole is not None:
                with contextlib.suppress(OSError):  # a cache it cannot write is only slower
                    out, publish = stack.enter_context(self._cache.new_entry(whole))
            self._hash(name, size, h, out)
            digest = h.hexdigest()
            if publish is not None and digest == expected:
                with contextlib.suppress(OSError):
                    publish()
                    self._whole_ok.add(expected)
        return self._matched(digest, expected, h.ranges())

    def _drop_cached(self, sha256: str, offset: int, length: int) -> bool:
        """Forget the local copies of a range (the whole shard kept and the range's own
        file); False when there are none to forget (a local generation, no cache)."""
        cache = self._cache_names(sha256, offset, length) if self.remote else None
        if cache is None:
            return False
        self._whole_ok.discard(sha256)
        whole, (sub, part) = cache
        self._cache.remove(whole)
        self._cache.remove(part, sub)
        return True

    def _matched(self, digest: str, expected: str, parts: dict) -> str:
        if expected and digest == expected:
            self._checked.setdefault(expected, {}).update(parts)
        return digest

    def _cache_names(self, sha256: str, offset: int, length: int):
        """``(whole shard's entry, (its ranges' subdirectory, this range's entry))`` in the
        cache (:class:`~shards.store.cache_files.CacheDir`), or None without one."""
        if self._cache is None or not sha256:
            return None
        _check_digest(sha256)
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 < length):
            raise ValueError(f"byte range {offset!r}+{length!r} cannot name a cache file")
        return f"{sha256}.tar", (sha256, f"{offset}-{length}")

    def _read_part(self, sub: str, name: str, length: int) -> bytes | None:
        """A cached range's bytes when the entry is whole and its trailer digest matches; a
        damaged or foreign entry is removed (None: fetch again)."""
        f = self._cache.open_read(name, sub)
        if f is None:
            return None
        with f:
            blob = f.read(length + _TRAILER + 1)
        data, digest = blob[:-_TRAILER], blob[-_TRAILER:]
        if len(blob) == length + _TRAILER and hashlib.sha256(data).digest() == digest:
            return data
        self._cache.remove(name, sub)
        return None


def sha256_of(path: str | os.PathLike) -> str:
    """The sha256 of a local file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
