"""``balancing.prewarm`` (issue 69, the first minute of a job): what a process's first kernel call
would pay is paid in a background thread while the job sets up, and a fork waits for that
thread's imports. Each case runs in a fresh interpreter (this one has imported everything)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from balancing import kernel_build as KB

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
        from balancing import kernel_build as KB
        mods = ("numba.np.arraymath", "scipy.optimize", "scipy.linalg.cython_blas")
        before = [m in sys.modules for m in mods]
        balancing.prewarm()
        balancing.prewarm()  # once per process
        assert F.prewarm_done(300)
        after = [m in sys.modules for m in mods]
        hits = [sum(k._cache_hits.values()) for k in KB.kernels()]
        misses = [sum(k._cache_misses.values()) for k in KB.kernels()]
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
        from balancing import kernel_build as KB
        balancing.prewarm()
        assert F.prewarm_done(300)
        loaded = sum(sum(k._cache_hits.values()) for k in KB.kernels())
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
        from balancing import kernel_build as KB
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


def test_the_compile_lock_admits_one_process_at_a_time_and_waits_a_bounded_time(
    tmp_path, monkeypatch
):
    """The ranks of a machine share numba's cache: one compiles, the others wait for it (then
    load). A holder that never lets go delays the others by ``wait_s`` at most."""
    monkeypatch.setattr(KB, "_lock_path", lambda: tmp_path / KB.LOCK_NAME)
    entered = {}

    def second(wait_s: float) -> None:
        t = time.monotonic()
        with KB.machine_lock(wait_s=wait_s):
            entered[wait_s] = time.monotonic() - t

    with KB.machine_lock():
        waiter = threading.Thread(target=second, args=(30.0,))
        waiter.start()
        time.sleep(0.6)
        assert waiter.is_alive()  # still waiting: the lock is held
    waiter.join(10)
    assert 0.5 <= entered[30.0] < 10
    with KB.machine_lock():
        second(0.3)  # held for good: goes on after its bound, without the lock
    assert 0.3 <= entered[0.3] < 5


def test_the_compile_lock_follows_no_symlink(tmp_path, monkeypatch):
    """A lock path swapped for a symlink (the cache directory may be shared) is not followed:
    no file is created or opened where it points, and the compile goes on without the lock."""
    target = tmp_path / "elsewhere" / "victim"
    target.parent.mkdir()
    lock = tmp_path / "cache" / KB.LOCK_NAME
    lock.parent.mkdir()
    lock.symlink_to(target)
    monkeypatch.setattr(KB, "_lock_path", lambda: lock)
    with KB.machine_lock(wait_s=1.0):
        pass
    assert not target.exists() and lock.is_symlink()


@pytest.mark.slow
def test_the_ranks_of_a_machine_compile_once_with_an_empty_cache(tmp_path):
    """Two processes sharing an empty cache both prewarm (two ranks of a node): every group of
    kernels compiles in child processes of one of them only, the other waits on the machine's
    lock, and both load every kernel from the cache (hits, no misses), not compiling any of
    them in process; each imports the solver meanwhile."""
    code = textwrap.dedent(
        """
        import json, sys, time
        import balancing
        from balancing import first_call as F
        from balancing import kernel_build as KB
        balancing.prewarm()
        deadline = time.monotonic() + 500
        while not F._READY.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        hits = [sum(k._cache_hits.values()) for k in KB.kernels()]
        misses = [sum(k._cache_misses.values()) for k in KB.kernels()]
        solver = "scipy.optimize" in sys.modules
        print(json.dumps([F._READY.is_set(), min(hits), max(misses), solver,
                          F._COMPILED_HERE.is_set()]))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path)}
    ranks = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [json.loads(r.communicate(timeout=600)[0].strip().splitlines()[-1]) for r in ranks]
    assert [o[:4] for o in outs] == [[True, 1, 0, True]] * 2, outs
    assert sorted(o[4] for o in outs) == [False, True], outs
