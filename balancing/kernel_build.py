"""Building the runtime kernels into numba's cache: which kernels, in which groups, by which
processes. :mod:`balancing.first_call` decides when; this module does it.

The kernels compile in child processes, one per group (the group ``post_balance`` needs first
among them), all at once: on a machine with a core per group the longest group sets the time,
not the sum. On a machine whose ranks share numba's cache (the usual case: one install), one
process compiles and the others wait for it (:func:`machine_lock`, an advisory lock beside the
cache's index files) and then load what it built: a node of 8 ranks compiles once, not 8 times.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from equishard.common.file_lock import flock_within

__all__ = ["GROUPS", "cached", "compile_all", "kernel_group", "machine_lock", "start_children"]

GROUPS = 3
LOCK_NAME = "equishard-compile.lock"
LOCK_WAIT_S = 900.0  # a holder that never lets go: compile anyway after this


def kernel_group(group: int) -> None:
    """Call one group of runtime kernels once on tiny inputs of the types the entry points pass
    (a cache load when numba has them cached, else a compile). Group 0 is what ``post_balance``
    runs at every size (the first plan of a step), 1 what it adds (capped LPT, Karmarkar-Karp,
    ``auto``'s second opinions), 2 the locality and node placement kernels and the microbatch
    ordering."""
    from balancing import _kernels as K

    x = np.array([5.0, 3.0, 3.0, 2.0, 1.0, 1.0])
    d = 2
    order = K._nb_argsort_desc(x)
    dest = np.zeros(x.size, dtype=np.int64)
    if group == 0:
        K._nb_lpt(x, order, d, dest)
        K._nb_refine(x, order, dest, d, 0.0, 4, 0.0, x, 0, True)
    elif group == 1:
        K._nb_lpt_capped(x, order, d, 0, 0.0, x, dest)
        K._nb_karmarkar_karp(x, order, d, True, dest)
        K._nb_lower_bound(x, order, d)
        K._nb_second_opinion(x, order, d, 0.0, 4, True, 7.5, dest)
    else:
        K._nb_local_first(x, order, np.zeros(x.size, dtype=np.int64), d, 1, 7.5, dest)
        K._nb_greedy_node_assign(np.zeros((d, d)), 1, np.empty(d, dtype=np.int64))
        # the 1F1B microbatch ordering: no twins, every rank runs its kernels (so the stages of
        # a pipeline order alike); compiled here so a trainer's first step does not wait for it
        from balancing.reorder import inter_microbatch_reorder

        inter_microbatch_reorder(x, 2)


def compile_all() -> None:
    """Call every runtime kernel once (each group in turn), in this process."""
    for group in range(GROUPS):
        kernel_group(group)


def kernels() -> tuple:
    """The runtime kernels that have exact twins (:mod:`balancing.twins`)."""
    from balancing import _kernels as K

    return (
        K._nb_argsort_desc,
        K._nb_lpt,
        K._nb_lpt_capped,
        K._nb_karmarkar_karp,
        K._nb_lower_bound,
        K._nb_second_opinion,
        K._nb_refine,
        K._nb_local_first,
        K._nb_greedy_node_assign,
    )


def cached() -> bool:
    """Whether numba's cache holds every runtime kernel already (an index file for each):
    then the kernels load in about a second where they are first called."""
    try:
        return all(os.path.exists(k._cache._cache_file._index_path) for k in kernels())
    except (AttributeError, OSError):  # another numba's internals: take the twins' path
        return False


def start_children() -> list[subprocess.Popen]:
    """Start compiling each group in a child process of its own (numba writes its cache)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    children = []
    for group in range(GROUPS):
        code = f"from balancing.kernel_build import kernel_group; kernel_group({group})"
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    return children


def wait_for(children: list[subprocess.Popen], timeout: float = 900.0) -> None:
    for child in children:
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _lock_path() -> Path | None:
    """The lock file beside the first kernel's cache index (the cache every rank of this install
    and ``NUMBA_CACHE_DIR`` shares), or None where numba's internals differ."""
    try:
        return Path(kernels()[0]._cache._cache_file._index_path).parent / LOCK_NAME
    except (AttributeError, TypeError):
        return None


@contextlib.contextmanager
def machine_lock(wait_s: float = LOCK_WAIT_S):
    """Hold the machine's compile lock (an advisory ``flock``), waiting for another process that
    holds it, at most ``wait_s`` (then go on without it). The file is opened without following
    a symlink; where it cannot be opened (a read-only cache, another user's file) there is no
    lock and this process compiles on its own, as without it. Released on exit, or when the
    process dies (the kernel drops a dead holder's lock)."""
    path, fd = _lock_path(), None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, 0o600)
        except OSError:
            fd = None
    try:
        if fd is not None:
            with contextlib.suppress(OSError):  # no locks on this file system: go on without
                flock_within(fd, wait_s, poll_s=0.1)  # not taken in time: go on without it
        yield
    finally:
        if fd is not None:
            os.close(fd)
