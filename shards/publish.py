"""Crash-safe file publishing: fsync, atomic rename, and the ``CURRENT`` pointer.

A generation is written into ``GEN_ROOT/.staging-<id>`` and becomes visible by one rename to
``GEN_ROOT/<id>``; ``GEN_ROOT/CURRENT`` (a one-line file naming the newest complete generation)
moves by writing ``CURRENT.tmp`` and renaming it over ``CURRENT``. Every rename is preceded by
an fsync of the file and followed by an fsync of its directory, so a crash at any point leaves
either the old or the new state on disk, never a mix.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

__all__ = [
    "CURRENT",
    "atomic_write_bytes",
    "fsync_dir",
    "parse_current",
    "read_current",
    "set_current",
    "try_lock",
]

CURRENT = "CURRENT"


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)


def read_current(root: str | os.PathLike) -> str | None:
    """The generation id ``CURRENT`` names, or None when the root has none yet. A name that
    would leave the root (a path, ``..``, a hidden entry) raises ``ValueError``."""
    try:
        text = (Path(root) / CURRENT).read_text()
    except FileNotFoundError:
        return None
    return parse_current(text, str(root))


def parse_current(text: str, root: str) -> str | None:
    """The generation a ``CURRENT`` file's ``text`` names (None if empty); ``ValueError`` for a
    name that would leave ``root``."""
    name = text.strip()
    if name and (name in (".", "..") or name.startswith(".") or "/" in name or "\\" in name):
        raise ValueError(
            f"{root}/{CURRENT} names {name!r}, not a generation inside {root}; write the "
            "name of one of its gen-* directories there"
        )
    return name or None


def set_current(root: str | os.PathLike, generation: str) -> None:
    atomic_write_bytes(Path(root) / CURRENT, (generation + "\n").encode())


def try_lock(path: str | os.PathLike):
    """An exclusive ``flock`` on ``path`` (created if needed), held until the returned file is
    closed; None when another process holds it."""
    f = open(path, "a+")  # noqa: SIM115 - the caller holds it open
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f
