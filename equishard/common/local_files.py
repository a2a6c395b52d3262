"""Reading a local file that a user, a template, a cache or another process names: it must be a
regular file, and a file read whole must be small.

Opening a FIFO blocks until a writer comes (forever, for a FIFO nobody writes), a device never
ends, a directory is no file: every such read would hang a command or exhaust its memory
instead of failing. Every file equishard reads whole (templates, their JSON configs, calibration,
sidecars, reports, ``CURRENT``) goes through :func:`read_small`; every file handed to a library
that opens it (pyarrow, tokenizers) through :func:`regular_file` first.
"""

from __future__ import annotations

import os
import stat

__all__ = ["read_small", "regular_file"]


def regular_file(path, what: str = "file"):
    """``path`` when it is a regular file (or a link to one); ``ValueError`` naming it and
    ``what`` it should be otherwise, ``FileNotFoundError`` when absent. A file object (bytes
    already read, e.g. from an object store) is returned as it is."""
    if not isinstance(path, str | os.PathLike):
        return path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file (a FIFO, device or directory), not a {what}")
    return path


def read_small(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of a small file read whole: a regular file (:func:`regular_file`) of at most
    ``limit`` bytes; ``ValueError`` naming it otherwise, ``FileNotFoundError`` if absent."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file (a FIFO, device or directory)")
    if st.st_size > limit:
        raise ValueError(f"{path}: {st.st_size} bytes, more than the {limit} such a file holds")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path}: grew past {limit} bytes while being read")
    return data
