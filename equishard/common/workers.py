"""Worker processes that never outlive the run that started them.

``ProcessPoolExecutor`` workers wait on a queue; when their parent is killed (SIGKILL, OOM
killer) nothing tells them, and they would stay alive indefinitely, holding memory and, for
the shard writer, writing files after the run's lock is gone. :func:`exit_with_parent` is
their initializer: on Linux the kernel sends the worker SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), and on every platform a watchdog thread ends the worker within half a
second of it being re-parented.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["MAX_WORKERS", "exit_with_parent", "usable_cores"]

_PR_SET_PDEATHSIG = 1
# worker processes a stage may start (--workers); more is a typo or a unit mix-up, and each is a
# process holding its own interpreter and tables
MAX_WORKERS = 1024


def _watch(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def exit_with_parent(parent: int) -> None:
    """Make this process exit when process ``parent`` (its parent, the run) dies."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the watchdog alone
        pass
    if os.getppid() != parent:  # died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="equishard-parent").start()


def usable_cores() -> int:
    """The cores this process may run on: its affinity, cut to a cgroup's CPU-time cap; or
    ``EQUISHARD_CORES`` where set (a container whose affinity shows the host's cores)."""
    given = os.environ.get("EQUISHARD_CORES", "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ValueError(f"EQUISHARD_CORES must be a whole number >= 1, got {given!r}")
        return int(given)
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores
