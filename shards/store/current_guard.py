"""Which moves of ``CURRENT`` a write may make: forward only, unless asked.

``CURRENT`` is what every loader opens, so moving it back to a generation published before it
silently drops what the newer one added (a night's samples). A write therefore moves it only

- to a generation that did not exist in the root before this run (a new one), provided nobody
  moved ``CURRENT`` while it was written (else the new generation would skip theirs), or
- to one that descends from what ``CURRENT`` names (its manifest's ``parent`` chain reaches it:
  a night written again after a rollback), or
- when asked (``equishard write --force``, ``WriteConfig.force``): a rollback on purpose.

Anything else is refused before ``CURRENT`` moves, naming what it holds and how to roll back.
Moves of a local root's ``CURRENT`` are made under ``<root>/.current.lock`` so that the check
and the move are one step for every writer and night of the root.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from equishard.common.file_lock import flock_within
from equishard.contracts.generation_names import valid_generation_name
from shards.errors import WriteError
from shards.store.manifest import ManifestError, load_manifest
from shards.store.publish import read_current

__all__ = ["CURRENT_LOCK", "current_lock", "descends_from", "refuse_rollback"]

CURRENT_LOCK = ".current.lock"
# a parent chain longer than this many generations is not followed further (a cycle or a
# hand-made chain can never hold a write)
MAX_CHAIN = 10_000
# the check and the move take milliseconds; a lock held longer is a stuck process
LOCK_WAIT_S = 60.0


def _parent_of(root: Path | None, generation: str) -> str | None:
    if root is None or not valid_generation_name(generation):
        return None
    try:
        return load_manifest(root / generation, check_files=False).parent
    except (ManifestError, OSError):
        return None  # retention removed it, or it is damaged: the chain ends here


def descends_from(root: Path | None, parent: str | None, ancestor: str) -> bool:
    """Whether ``ancestor`` is on the parent chain that starts at ``parent`` (the manifest's
    own parent), following the manifests under ``root`` (None: only ``parent`` itself)."""
    seen: set[str] = set()
    while parent is not None and parent not in seen and len(seen) < MAX_CHAIN:
        if parent == ancestor:
            return True
        seen.add(parent)
        parent = _parent_of(root, parent)
    return False


def refuse_rollback(where: str, current: str, generation: str) -> WriteError:
    return WriteError(
        f"{where}/CURRENT names {current}, and {generation} was published there before it: "
        f"making {generation} CURRENT again would roll the root back (every loader opening "
        f"it would lose what {current} added); CURRENT stays at {current}. To roll back on "
        "purpose, run the same 'equishard write' with --force"
    )


def refuse_moved(where: str, started: str | None, now: str, generation: str) -> WriteError:
    return WriteError(
        f"{where}/CURRENT moved from {started or '(none)'} to {now} while this run wrote "
        f"{generation}; publishing it would skip what {now} added, so CURRENT stays at {now}. "
        f"Run again to write {generation} after {now}, or add --force to publish it anyway"
    )


@contextlib.contextmanager
def current_lock(root: Path):
    """Hold ``root/.current.lock`` (an ``flock``; the file is opened without following a
    symlink, so nobody can point it elsewhere); ``WriteError`` after a minute's wait."""
    path = root / CURRENT_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise WriteError(f"{path}: cannot open the CURRENT lock ({exc.strerror})") from None
    try:
        if not flock_within(fd, LOCK_WAIT_S):
            raise WriteError(
                f"{path}: held by another process for over {LOCK_WAIT_S:.0f} s; "
                "find it (fuser) or remove the file if no equishard runs there"
            )
        yield read_current(root)
    finally:
        os.close(fd)
