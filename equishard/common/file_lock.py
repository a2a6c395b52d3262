"""An exclusive ``flock`` taken within a bounded wait: the one waiting loop behind the locks
equishard holds in directories others share (CURRENT's guard, the kernel compile's)."""

from __future__ import annotations

import fcntl
import time

__all__ = ["flock_within"]


def flock_within(fd: int, wait_s: float, poll_s: float = 0.05) -> bool:
    """Take an exclusive ``flock`` on ``fd``, waiting for another holder at most ``wait_s``
    seconds (polling every ``poll_s``); whether it was taken. ``OSError`` other than the lock
    being held (a file system without locks) propagates."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
