"""``balancing.prewarm`` (issue 69, the first minute of a job): what a process's first kernel call
would pay is paid in a background thread while the job sets up, and a fork waits for that
thread's imports. Each case runs in a fresh interpreter (this one has imported everything)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return (out.stdout.strip().splitlines() or [""])[-1]


def test_prewarm_loads_the_cached_kernels_and_what_their_first_dispatch_imports():
    """With the install's cache, numba's first dispatch imports its registries and scipy's BLAS
    (``numba.np.arraymath``), and ``nodewise_permutation`` imports scipy's assignment solver:
    neither is imported by ``import balancing`` itself, both are after ``prewarm`` (a
    prewarm that did nothing leaves them out), and the kernels are ready without a call."""
    _run("from balancing import first_call as F; F.warm_up()")  # the install's cache
    got = _run(
        """
        import json, sys
        import balancing
        from balancing import first_call as F
        mods = ("numba.np.arraymath", "scipy.optimize", "scipy.linalg.cython_blas")
        before = [m in sys.modules for m in mods]
        balancing.prewarm()
        balancing.prewarm()  # once per process
        assert F.prewarm_done(300)
        after = [m in sys.modules for m in mods]
        hits = [sum(k._cache_hits.values()) for k in F._kernels()]
        misses = [sum(k._cache_misses.values()) for k in F._kernels()]
        print(json.dumps([before, after, F._READY.is_set(), min(hits), max(misses)]))
        """
    )
    assert got == "[[false, false, false], [true, true, true], true, 1, 0]"


def test_prewarm_in_python_mode_imports_the_solver_and_loads_no_kernel():
    got = _run(
        """
        import json, sys
        import balancing
        from balancing import first_call as F
        balancing.prewarm()
        assert F.prewarm_done(300)
        loaded = sum(sum(k._cache_hits.values()) for k in F._kernels())
        print(json.dumps(["scipy.optimize" in sys.modules, F._READY.is_set(), loaded]))
        """,
        EQUISHARD_FIRST_CALL="python",
    )
    assert got == "[true, false, 0]"


def test_a_fork_waits_for_a_background_import_or_load():
    """A child forked while the thread imports would inherit module and compiler locks held by
    a thread it does not have: the fork waits until the thread lets go, and the child starts
    with the lock free."""
    got = _run(
        """
        import os, threading, time
        from balancing import first_call as F
        inside, done = threading.Event(), []
        def hold():
            with F._LOADING:
                inside.set()
                time.sleep(0.5)
                done.append(1)
        threading.Thread(target=hold).start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if done and F._LOADING.acquire(timeout=1) else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), F._LOADING.acquire(timeout=1))
        """
    )
    assert got == "0 True"


@pytest.mark.slow
def test_prewarm_with_an_empty_cache_compiles_every_group_in_children(tmp_path):
    """With an empty cache, prewarm starts the compile at once (no entry point called): every
    group of kernels compiles in a child process, and this process loads them all from the
    cache (hits, no misses) rather than compiling any of them itself; it imports the solver
    meanwhile."""
    got = _run(
        """
        import json, sys, time
        import balancing
        from balancing import first_call as F
        assert not F._cached()
        balancing.prewarm()
        deadline = time.monotonic() + 500
        while not F._READY.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        hits = [sum(k._cache_hits.values()) for k in F._kernels()]
        misses = [sum(k._cache_misses.values()) for k in F._kernels()]
        solver = "scipy.optimize" in sys.modules
        print(json.dumps([F._READY.is_set(), F._cached(), min(hits), max(misses), solver]))
        """,
        NUMBA_CACHE_DIR=str(tmp_path),
    )
    assert got == "[true, true, 1, 0, true]"
