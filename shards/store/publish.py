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
import json
import os
import secrets
from pathlib import Path

from equishard.common.durable import fsync_dir  # re-exported: the shards publish through it
from equishard.common.local_files import (
    read_small,  # re-exported: shards read small files through it
)
from equishard.contracts.generation_names import CURRENT, HISTORY, valid_generation_name

__all__ = [
    "CURRENT",
    "HISTORY",
    "atomic_write_bytes",
    "fsync_dir",
    "note_current",
    "open_new",
    "parse_current",
    "read_current",
    "read_history",
    "read_small",
    "set_current",
    "temp_beside",
    "try_lock",
    "valid_generation_name",
]


# a file equishard creates in a directory others may write (an output root, a staging root)
# is new, never reached through a symlink: O_EXCL fails on any name already there, a link too
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def open_new(path: str | os.PathLike, mode: int = 0o644):
    """A new file at ``path``, opened for binary writing: ``O_CREAT|O_EXCL|O_NOFOLLOW``, so a
    name someone put there first (a symlink to a file of the user's) fails instead of being
    written through (``FileExistsError``)."""
    return os.fdopen(os.open(path, _NEW, mode), "wb")


def temp_beside(path: Path) -> Path:
    """A temporary name beside ``path`` that nobody can guess ahead (``.NAME.tmp-PID-RANDOM``:
    the ``.*.tmp-*`` pattern killed runs' leftovers are cleaned by)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(6)}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one: a new
    temporary file (:func:`open_new`), fsynced, renamed over ``path`` (a rename replaces the
    name, never writes through a link there), then the directory fsynced."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        with open_new(tmp) as f:
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
        text = read_small(Path(root) / CURRENT, 4096).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    return parse_current(text, str(root))


def parse_current(text: str, root: str) -> str | None:
    """The generation a ``CURRENT`` file's ``text`` names (None if empty); ``ValueError`` for a
    name that would leave ``root``."""
    name = text.strip()
    if name and not valid_generation_name(name):
        raise ValueError(
            f"{root}/{CURRENT} names {name!r}, not a generation inside {root}; write the "
            "name of one of its gen-* directories there"
        )
    return name or None


_HISTORY_LINES = 2000


def note_current(root: str | os.PathLike, generation: str, event: str = "current") -> None:
    """Append ``{"event", "generation"}`` to the root's CURRENT history (what retention keeps
    by: a generation that became CURRENT within the last nights stays, whatever its files'
    times say). No time stamps, so the same runs write the same bytes; kept to its last lines;
    never read for anything but keeping more."""
    path = Path(root) / HISTORY
    line = json.dumps({"event": event, "generation": generation}) + "\n"
    try:
        old = read_small(path, 16 << 20).decode(errors="replace").splitlines(keepends=True)
    except FileNotFoundError:
        old = []
    except ValueError:  # replaced by something that is not this file (a FIFO): start anew
        atomic_write_bytes(path, line.encode())
        return
    if len(old) < _HISTORY_LINES:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        with os.fdopen(os.open(path, flags, 0o644), "a") as f:  # never through a link
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    else:
        atomic_write_bytes(path, "".join([*old[-_HISTORY_LINES // 2 :], line]).encode())


def read_history(root: str | os.PathLike) -> list[tuple[str, str]]:
    """``(event, generation)`` in order; lines that are not what :func:`note_current` writes
    (a damaged or hand-edited file) are left out."""
    try:
        text = read_small(Path(root) / HISTORY, 16 << 20).decode(errors="replace")
    except (FileNotFoundError, ValueError):
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
            event, gen = rec["event"], rec["generation"]
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if isinstance(event, str) and isinstance(gen, str) and valid_generation_name(gen):
            out.append((event, gen))
    return out


def set_current(root: str | os.PathLike, generation: str) -> None:
    atomic_write_bytes(Path(root) / CURRENT, (generation + "\n").encode())
    note_current(root, generation)


def try_lock(path: str | os.PathLike):
    """An exclusive ``flock`` on ``path`` (created if needed), held until the returned file is
    closed; None when another process holds it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW  # never through a link
    f = os.fdopen(os.open(path, flags, 0o644), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f
