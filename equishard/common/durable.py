"""Publishing a file by rename so that a crash or a power loss leaves the old file or the whole
new one, never an empty or half-written file under the final name.

A rename is atomic for the name, not for the data: without an ``fsync`` of the file first, a
power loss can leave the new name pointing at blocks that never reached the disk (an empty
cost table under its real name); without an ``fsync`` of the directory after, the rename itself
may be lost. A SIGKILL test cannot see either (the page cache survives a killed process), so
the order is tested by recording the calls (tests/test_durability_order.py).
"""

from __future__ import annotations

import os

# (os.open makes every descriptor close-on-exec itself, PEP 446: no O_CLOEXEC needed)

__all__ = ["durable_replace", "fsync_dir", "fsync_file"]


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file written (and closed) by someone else, a library for example, to disk; on
    a directory, its entries (a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_file  # the same call on a directory: its entries reach the disk


def durable_replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``os.replace(src, dst)`` in the order that survives a power loss: ``src``'s data
    flushed, the rename, then ``dst``'s directory flushed."""
    fsync_file(src)
    os.replace(src, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)))
