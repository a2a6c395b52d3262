"""The runtime balancer's first calls in a fresh process, before numba has compiled its kernels.

With an empty numba cache (a fresh container, a read-only site-packages) the runtime kernels take
many seconds to compile, and every rank of a training job would wait that long at its first step.
So the first call starts compiling them in the background (:func:`start_warming`: child
processes, one per group of kernels and one set per machine, compile into numba's cache once
the first call has returned, then a thread loads them: :mod:`balancing.kernel_build`;
:func:`prewarm` starts the same at a job's set-up, or loads cached kernels there;
:func:`warm_up` at start-up, blocking) and, until they are ready, runs the exact pure-Python
twins of :mod:`balancing.twins`: the same plan to the bit (the runtime plan must be the same on
every rank, whichever path a rank took). Once the kernels are ready every call uses them.
``EQUISHARD_FIRST_CALL=kernels`` always runs the kernels (compiling in the caller); ``python``
always runs the twins.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading

from balancing import kernel_build

__all__ = [
    "entry_point",
    "kernels_ready",
    "prewarm",
    "prewarm_done",
    "start_warming",
    "warm_up",
]

_READY = threading.Event()
_STARTED = threading.Lock()
_thread: threading.Thread | None = None


def _mode() -> str:
    mode = os.environ.get("EQUISHARD_FIRST_CALL", "auto")
    if mode not in ("auto", "kernels", "python"):
        raise ValueError(f"EQUISHARD_FIRST_CALL must be auto, kernels or python, got {mode!r}")
    return mode


_FIRST_DONE = threading.Event()  # an entry point's first call has returned


def entry_point(fn):
    """Mark a runtime entry point: the background compile starts once its first call (on the
    twins) has returned, so that call does not share the interpreter with the compiler."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            _FIRST_DONE.set()

    return wrapper


def warm_up() -> None:
    """Compile (or load from numba's cache) every runtime kernel now, in this thread."""
    kernel_build.compile_all()
    _READY.set()


_IN_PROCESS = threading.Event()  # the background thread compiles or loads in this process
_COMPILED_HERE = threading.Event()  # this process started the compiling children


def _warm_in_background() -> None:
    """Compile in child processes (numba writes its cache; the compiler holds this process's
    interpreter lock for seconds at a time otherwise), then load the kernels from the cache
    here. Where the children cannot help (no writable cache), compile here."""
    _FIRST_DONE.wait(timeout=30)
    with kernel_build.machine_lock():  # the ranks of a machine: one compiles, the others wait
        if not kernel_build.cached():
            children = kernel_build.start_children()
            _COMPILED_HERE.set()
            _import_solver()  # while they compile (nodewise_permutation's first call pays it)
            kernel_build.wait_for(children)
    _import_solver()
    _IN_PROCESS.set()
    if kernel_build.cached():
        with _LOADING:  # a fork waits for the load (see _before_fork)
            warm_up()
        return
    warm_up()


def _finish_at_exit() -> None:
    """A process that exits while the thread compiles or loads kernels in it waits for it
    (tearing the interpreter down under a compile is unsafe); a child compiling on its own
    goes on and leaves the kernels in numba's cache for the next process."""
    if _thread is not None and _thread.is_alive() and _IN_PROCESS.is_set():
        _thread.join(timeout=600)


def start_warming() -> None:
    """Start compiling the kernels in a daemon thread, once per process."""
    global _thread
    with _STARTED:
        if _thread is None and not _READY.is_set():
            _thread = threading.Thread(
                target=_warm_in_background, name="equishard-numba-warm", daemon=True
            )
            _thread.start()
            atexit.register(_finish_at_exit)


_FORKED_MID_COMPILE = False
# held while a background thread imports modules or loads kernels in this process: a process
# forked meanwhile would inherit import and compiler locks held by a thread it does not have
# (and hang at its first import of the same module), so a fork waits for it (a second at most
# where the kernels are cached; bounded by _FORK_WAIT_S whatever happens)
_LOADING = threading.Lock()
_FORK_WAIT_S = 30.0
_held_for_fork = False


def _before_fork() -> None:
    global _held_for_fork
    _held_for_fork = _LOADING.acquire(timeout=_FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _LOADING.release()


def _after_fork_in_child() -> None:
    """A child forked while the warm thread compiled inherits numba's compiler lock held by a
    thread it does not have: it must never compile, so it keeps to the twins."""
    global _FORKED_MID_COMPILE, _thread, _prewarm_thread, _LOADING, _held_for_fork
    if _thread is not None and not _READY.is_set():
        _FORKED_MID_COMPILE = True
    _thread = None
    _prewarm_thread = None
    _LOADING = threading.Lock()
    _held_for_fork = False


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)

_prewarm_thread: threading.Thread | None = None


def prewarm() -> None:
    """Get the runtime balancer ready while the job sets up, in a background thread; returns at
    once. Where numba's cache holds the kernels (the install's warm-up) they are loaded, with
    what numba imports at its first dispatch (scipy's BLAS: 0.2-0.5 s), and scipy's assignment
    solver ``nodewise_permutation`` uses; with an empty cache the kernels start compiling in
    child processes now instead of after the first call. ``balance_model`` and the reference
    trainer call it when they are built; call it at start-up where you call the entry points
    yourself. Plans do not depend on it (the twins are exact). A process forks only once the
    thread is not importing or loading (a fork waits for it)."""
    global _prewarm_thread
    mode = _mode()
    with _STARTED:
        if _prewarm_thread is not None:
            return
        _prewarm_thread = threading.Thread(
            target=_prewarm, args=(mode,), name="equishard-prewarm", daemon=True
        )
        _prewarm_thread.start()
        atexit.register(prewarm_done, 600)  # no interpreter teardown under a kernel load


def _import_solver() -> None:
    """Import scipy's assignment solver (``nodewise_permutation``'s), a fork waiting for it."""
    with _LOADING, contextlib.suppress(ImportError):
        import scipy.optimize  # noqa: F401


def _prewarm(mode: str) -> None:
    fresh = not _READY.is_set() and not _FORKED_MID_COMPILE
    if mode == "auto" and fresh and not kernel_build.cached():
        _FIRST_DONE.set()  # no first call to wait for: the job is setting up
        start_warming()  # its thread imports the solver while the children compile
        return
    _import_solver()
    with _LOADING:
        if mode != "python" and fresh and kernel_build.cached():
            warm_up()


def prewarm_done(timeout: float | None = None) -> bool:
    """Wait for :func:`prewarm`'s thread (not for a compile it started); whether it ended."""
    thread = _prewarm_thread
    if thread is None:
        return True
    thread.join(timeout)
    return not thread.is_alive()


def kernels_ready() -> bool:
    """Whether the entry points should run the numba kernels now (starting their compile in
    the background when they are not ready yet)."""
    mode = _mode()
    if _READY.is_set() or (mode == "kernels" and not _FORKED_MID_COMPILE):
        return True
    if mode == "auto" and not _FORKED_MID_COMPILE and _thread is None and kernel_build.cached():
        _READY.set()  # loaded on demand from the cache, no compile to wait for
        return True
    if mode == "auto" and not _FORKED_MID_COMPILE:
        start_warming()
    return False
