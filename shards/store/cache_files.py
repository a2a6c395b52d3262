"""Entries of a cache directory that others may write: created so that nobody can redirect them.

Ranks and DataLoader workers share one ``cache_dir`` (docs/shards/loader.md), and so may other
users of a machine. Anyone who can write that directory could once plant a symlink where the
loader was about to write (its temp names were predictable: ``.<sha>.tar.tmp-<pid>``) and have
the training job overwrite any file it can write, or make ``<cache>/<sha>`` a link to another
directory and have range files written there. Here:

- the cache directory itself is refused when anyone may write it (``o+w``) without the sticky
  bit (in such a directory anyone may also rename or delete our entries);
- every entry is reached through a file descriptor of its directory, with ``O_NOFOLLOW``: a
  subdirectory or entry that is a symlink, or not what it should be, is removed (or, where that
  is not allowed, treated as a miss), never followed;
- a new entry is created under a random name with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and renamed
  into place (a rename replaces a planted name, never writes through it);
- an entry is opened for reading with ``O_NOFOLLOW|O_NONBLOCK`` and must be a regular file
  (a FIFO would block the read forever).

What an entry holds is never trusted either: :mod:`shards.store.storage` checks every byte it reads
back against the manifest's digests.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["CacheDir"]

_DIR = os.O_RDONLY | os.O_DIRECTORY


class CacheDir:
    """A checked cache directory; entries are ``name`` or ``sub/name`` (one level)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:  # (a file or a link to one there: FileExistsError)
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = os.stat(self.path)
        except OSError as exc:
            raise ValueError(f"cache_dir {self.path}: cannot create it ({exc.strerror})") from None
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise ValueError(
                f"cache_dir {self.path}: anyone may write it and it has no sticky bit, so "
                "anyone could replace or remove the cached shards; 'chmod o-w' it, 'chmod +t' "
                "it, or give a cache directory of your own"
            )

    @contextlib.contextmanager
    def _dir(self, sub: str | None, create: bool):
        """A descriptor of the cache directory or of its subdirectory ``sub`` (never through a
        symlink: one planted there is removed); None when ``sub`` is absent and not created."""
        root = os.open(self.path, _DIR)
        try:
            if sub is None:
                yield root
                return
            _plain(sub)
            fd = None
            # at most: remove what was planted, make the directory, open it
            for _ in range(3):
                try:
                    fd = os.open(sub, _DIR | os.O_NOFOLLOW, dir_fd=root)
                    break
                except FileNotFoundError:
                    if not create:
                        break
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(sub, 0o700, dir_fd=root)
                except OSError:  # a symlink (ELOOP) or a file (ENOTDIR) put in its place
                    os.unlink(sub, dir_fd=root)  # PermissionError: not ours to fix, a miss
            try:
                yield fd
            finally:
                if fd is not None:
                    os.close(fd)
        finally:
            os.close(root)

    def open_read(self, name: str, sub: str | None = None):
        """The entry as a binary file, or None when it is absent or was not a regular file (a
        symlink, FIFO or device there is removed)."""
        _plain(name)
        try:
            with self._dir(sub, create=False) as d:
                if d is None:
                    return None
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                try:
                    fd = os.open(name, flags, dir_fd=d)
                except FileNotFoundError:
                    return None
                except OSError:  # ELOOP: a symlink
                    _remove(name, d)
                    return None
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    _remove(name, d)
                    return None
                os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
        except PermissionError:
            return None

    def remove(self, name: str, sub: str | None = None) -> None:
        _plain(name)
        with contextlib.suppress(OSError), self._dir(sub, create=False) as d:
            if d is not None:
                _remove(name, d)

    @contextlib.contextmanager
    def new_entry(self, name: str, sub: str | None = None):
        """A new entry being written: yields ``(file, publish)``; ``publish()`` renames it into
        place as ``name``; left unpublished, it is removed."""
        _plain(name)
        with self._dir(sub, create=True) as d:
            if d is None:
                raise FileNotFoundError(f"{self.path / (sub or '')}: could not be made")
            tmp = f".{name}.{secrets.token_hex(8)}.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            f = os.fdopen(os.open(tmp, flags, 0o600, dir_fd=d), "wb")
            done = []

            def publish() -> None:
                f.flush()
                os.replace(tmp, name, src_dir_fd=d, dst_dir_fd=d)
                done.append(True)

            try:
                yield f, publish
            finally:
                f.close()
                if not done:
                    _remove(tmp, d)

    def write(self, name: str, data: bytes, sub: str | None = None) -> None:
        with self.new_entry(name, sub) as (f, publish):
            f.write(data)
            publish()


def _plain(name: str) -> None:
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        raise ValueError(f"{name!r} cannot name a cache entry")


def _remove(name: str, dir_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError, PermissionError, IsADirectoryError):
        os.unlink(name, dir_fd=dir_fd)
