"""The runtime balancer's first calls in a fresh process, before numba has compiled its kernels.

With an empty numba cache (a fresh container, a read-only site-packages) the runtime kernels take
many seconds to compile, and every rank of a training job would wait that long at its first step.
So the first call starts compiling them in the background (:func:`start_warming`: a child
process compiles into numba's cache once the first call has returned, then a thread loads them;
or :func:`warm_up` at start-up, blocking) and, until they are ready, runs exact pure-Python twins
of the same kernels: the same plan to the bit (the runtime plan must be the same on every rank,
whichever path a rank took), checked against the kernels over many seeds in the tests. Once the
kernels are ready every call uses them. ``EQUISHARD_FIRST_CALL=kernels`` always runs the kernels
(compiling in the caller); ``python`` always runs the twins.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import functools
import heapq
import os
import subprocess
import sys
import threading

import numpy as np

from balancing import _reference as R

__all__ = ["entry_point", "kernels_ready", "lpt", "refine", "start_warming", "warm_up"]

_READY = threading.Event()
_STARTED = threading.Lock()
_thread: threading.Thread | None = None


def _compile_all() -> None:
    """Call every runtime kernel once on tiny inputs of the types the entry points pass (a cache
    load when numba has them cached, else a compile)."""
    from balancing._kernels import (
        _nb_argsort_desc,
        _nb_greedy_node_assign,
        _nb_karmarkar_karp,
        _nb_local_first,
        _nb_lpt,
        _nb_lpt_capped,
        _nb_refine,
    )

    x = np.array([5.0, 3.0, 3.0, 2.0, 1.0, 1.0])
    d = 2
    order = _nb_argsort_desc(x)
    dest = np.zeros(x.size, dtype=np.int64)
    _nb_lpt(x, order, d, dest)
    _nb_lpt_capped(x, order, d, 0, 0.0, x, dest)
    _nb_karmarkar_karp(x, order, d, True, dest)
    _nb_refine(x, order, dest, d, 0.0, 4, 0.0, x, 0, True)
    _nb_local_first(x, order, np.zeros(x.size, dtype=np.int64), d, 1, 7.5, dest)
    _nb_greedy_node_assign(np.zeros((d, d)), 1, np.empty(d, dtype=np.int64))
    # the 1F1B microbatch ordering: no twins, every rank runs its kernels (so the stages of a
    # pipeline order alike); compiled here so a trainer's first step does not wait for it
    from balancing.reorder import inter_microbatch_reorder

    inter_microbatch_reorder(x, 2)


def _kernels() -> tuple:
    from balancing import _kernels as K

    return (
        K._nb_argsort_desc,
        K._nb_lpt,
        K._nb_lpt_capped,
        K._nb_karmarkar_karp,
        K._nb_refine,
        K._nb_local_first,
        K._nb_greedy_node_assign,
    )


def _cached() -> bool:
    """Whether numba's cache holds every runtime kernel already (an index file for each):
    then the kernels load in about a second where they are first called, as before."""
    try:
        return all(os.path.exists(k._cache._cache_file._index_path) for k in _kernels())
    except (AttributeError, OSError):  # another numba's internals: take the twins' path
        return False


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
    _compile_all()
    _READY.set()


_IN_PROCESS = threading.Event()  # the background thread compiles or loads in this process


def _warm_in_background() -> None:
    """Compile in a child process (numba writes its cache; the compiler holds this process's
    interpreter lock for seconds at a time otherwise), then load the kernels from the cache
    here. Where the child cannot help (no writable cache), compile here."""
    _FIRST_DONE.wait(timeout=30)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = "from balancing.first_call import _compile_all; _compile_all()"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, timeout=900, check=False
        )
    _IN_PROCESS.set()
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


def _after_fork_in_child() -> None:
    """A child forked while the warm thread compiled inherits numba's compiler lock held by a
    thread it does not have: it must never compile, so it keeps to the twins."""
    global _FORKED_MID_COMPILE, _thread
    if _thread is not None and not _READY.is_set():
        _FORKED_MID_COMPILE = True
    _thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def kernels_ready() -> bool:
    """Whether the entry points should run the numba kernels now (starting their compile in
    the background when they are not ready yet)."""
    mode = _mode()
    if _READY.is_set() or (mode == "kernels" and not _FORKED_MID_COMPILE):
        return True
    if mode == "auto" and not _FORKED_MID_COMPILE and _thread is None and _cached():
        _READY.set()  # loaded on demand from the cache, no compile to wait for
        return True
    if mode == "auto" and not _FORKED_MID_COMPILE:
        start_warming()
    return False


def argsort_desc(x: np.ndarray) -> np.ndarray:
    """``_nb_argsort_desc``: indices sorting ``x`` descending, ties by index."""
    return np.argsort(-x, kind="stable").astype(np.int64)


def lpt(x: np.ndarray, order: np.ndarray, d: int) -> np.ndarray:
    """``_nb_lpt``: each item onto the least-loaded bin, ties to the lowest bin."""
    dest = np.zeros(x.size, dtype=np.int64)
    heap = [(0.0, b) for b in range(d)]
    xs = x.tolist()
    for i in order.tolist():
        load, b = heap[0]
        dest[i] = b
        heapq.heapreplace(heap, (load + xs[i], b))
    return dest


def karmarkar_karp(x: np.ndarray, order: np.ndarray, d: int, equal: bool) -> np.ndarray:
    """``_nb_karmarkar_karp`` (the reference's merge order and ties)."""
    got = R.karmarkar_karp(x.tolist(), order.tolist(), d, equal)
    return np.array([got[i] for i in range(x.size)], dtype=np.int64)


def local_first(x, order, src, d, per_node, target) -> np.ndarray:
    """``_nb_local_first``: home while under ``target``, then the node's lightest rank that
    stays under it, then the lightest rank anywhere (the lowest on a tie)."""
    xs, src_l = x.tolist(), src.tolist()
    loads = [0.0] * d
    dest = np.empty(len(xs), dtype=np.int64)
    pending, rest = [], []
    for i in order.tolist():
        r = src_l[i]
        if loads[r] == 0 or loads[r] + xs[i] <= target:
            dest[i] = r
            loads[r] += xs[i]
        else:
            pending.append(i)
    for i in pending:
        base = (src_l[i] // per_node) * per_node
        fits = [r for r in range(base, base + per_node) if loads[r] + xs[i] <= target]
        if fits:
            r = min(fits, key=lambda r: (loads[r], r))
            dest[i] = r
            loads[r] += xs[i]
        else:
            rest.append(i)
    heap = [(loads[r], r) for r in range(d)]
    heapq.heapify(heap)
    for i in rest:
        r = _top(heap, loads, 1.0)
        dest[i] = r
        loads[r] += xs[i]
        heapq.heappush(heap, (loads[r], r))
    return dest


def _pair_step(xs, items, lens, a, b, gap, moves, width, cap, cm, mem):
    """``balancing._kernels.refine._pair_step`` over per-bin ascending lists."""
    half = gap / 2
    best_pa, best_pb, best_err = -1, -1, np.inf
    ib_items, ib_lens = items[b], lens[b]
    nb = len(ib_items)
    can_move = moves and nb < width
    lo = 0
    for pa, ia in enumerate(items[a]):
        x = xs[ia]
        if can_move and 0 < x < gap and (cap <= 0 or mem[b] + cm[ia] <= cap):
            err = abs(x - half)
            if err < best_err:
                best_err, best_pa, best_pb = err, pa, -1
        want = x - half
        while lo < nb and ib_lens[lo] < want:
            lo += 1
        for c in (lo - 1, lo):
            if 0 <= c < nb:
                ib = ib_items[c]
                delta = x - xs[ib]
                if 0 < delta < gap:
                    if cap > 0:
                        dm = cm[ia] - cm[ib]
                        if mem[b] + dm > cap or mem[a] - dm > cap:
                            continue
                    err = abs(delta - half)
                    if err < best_err:
                        best_err, best_pa, best_pb = err, pa, c
    return best_pa, best_pb


def _top(heap: list, loads: list, sign: float) -> int:
    """The bin on top of a lazy heap of (sign * load, bin), dropping entries a later load made
    stale: the least (sign 1) or most (sign -1) loaded bin, the lowest index on a tie."""
    while heap[0][0] != sign * loads[heap[0][1]]:
        heapq.heappop(heap)
    return heap[0][1]


def refine(x, order, bins, d, target, max_steps, cap, cap_lengths, max_count, moves):
    """``_nb_refine``, the same steps in the same order (every float computed as it does).
    Updates ``bins``; returns the loads."""
    xs, cm, order_l = x.tolist(), cap_lengths.tolist(), order.tolist()
    n = len(xs)
    b_of = bins.tolist()
    loads, mem, cnt = [0.0] * d, [0.0] * d, [0] * d
    for i in range(n):
        loads[b_of[i]] += xs[i]
        mem[b_of[i]] += cm[i]
        cnt[b_of[i]] += 1
    top = max(cnt) if d > 0 else 0
    width = top + max(4, top // 2)
    if max_count > 0:
        width = max(top, min(width, max_count))
    items = [[] for _ in range(d)]
    lens = [[] for _ in range(d)]
    rank = [0] * n
    ascending = [0.0] * n
    for k in range(n - 1, -1, -1):
        i = order_l[k]
        items[b_of[i]].append(i)
        lens[b_of[i]].append(xs[i])
        rank[i] = n - 1 - k
        ascending[n - 1 - k] = xs[i]
    lightest = [(loads[b], b) for b in range(d)]
    heaviest = [(-loads[b], b) for b in range(d)]
    heapq.heapify(lightest)
    heapq.heapify(heaviest)
    val = None  # load of the item's bin - its length, in ascending rank (the kernel's tree)
    for _ in range(max_steps):
        a = _top(heaviest, loads, -1.0)
        if loads[a] <= target:
            break
        b = _top(lightest, loads, 1.0)
        args = (moves, width, cap, cm, mem)
        pa, pb = _pair_step(xs, items, lens, a, b, loads[a] - loads[b], *args)
        if pa < 0:
            if val is None:
                val = np.empty(n)
                for c in range(d):
                    for i in items[c]:
                        val[rank[i]] = loads[c] - xs[i]
            slack = 0.0
            # prefix minima of val and, for each, the first leaf holding it (the tree's answer)
            top_q = bisect.bisect_left(ascending, xs[items[a][-1]]) if items[a] else 0
            run_min = np.minimum.accumulate(val[:top_q])
            neg = -run_min
            for ia in reversed(items[a]):
                xa = xs[ia]
                q = bisect.bisect_left(ascending, xa)
                if q == 0:
                    continue
                best = float(run_min[q - 1])
                if loads[a] - xa - best > slack:
                    slack = loads[a] - xa - best
                    leaf = int(np.searchsorted(neg, -best, side="left"))
                    b = b_of[order_l[n - 1 - leaf]]
            if slack > 0:
                pa, pb = _pair_step(xs, items, lens, a, b, loads[a] - loads[b], *args)
        if pa < 0 and (cap > 0 or max_count > 0):
            for b in sorted(range(d), key=lambda c: (loads[c], c)):
                if loads[b] >= loads[a]:
                    break
                pa, pb = _pair_step(xs, items, lens, a, b, loads[a] - loads[b], *args)
                if pa >= 0:
                    break
        if pa < 0:
            break
        ia = items[a].pop(pa)
        lens[a].pop(pa)
        delta = xs[ia]
        dm = cm[ia]
        if pb >= 0:
            ib = items[b].pop(pb)
            lens[b].pop(pb)
            p = bisect.bisect_right(lens[a], xs[ib])
            items[a].insert(p, ib)
            lens[a].insert(p, xs[ib])
            b_of[ib] = a
            delta -= xs[ib]
            dm -= cm[ib]
        p = bisect.bisect_right(lens[b], xs[ia])
        items[b].insert(p, ia)
        lens[b].insert(p, xs[ia])
        b_of[ia] = b
        loads[a] -= delta
        loads[b] += delta
        mem[a] -= dm
        mem[b] += dm
        for c in (a, b):
            heapq.heappush(lightest, (loads[c], c))
            heapq.heappush(heaviest, (-loads[c], c))
            if val is not None:
                for i in items[c]:
                    val[rank[i]] = loads[c] - xs[i]
    bins[:] = b_of
    return np.array(loads)


def greedy_node_assign(benefit: np.ndarray, per_node: int) -> np.ndarray:
    """``_nb_greedy_node_assign``: batches to nodes, the (batch, node) pair of highest benefit
    first (ties: row-major), at most ``per_node`` batches per node."""
    d, nodes = benefit.shape
    node_of = np.full(d, -1, dtype=np.int64)
    used = [0] * nodes
    left = d
    flat = benefit.ravel()
    # the pairs of positive benefit in the kernel's order; the rest (benefits are volumes, so
    # >= 0: zeros) follow in row-major order, which the loop below walks without sorting them
    # (a batch gets the first node with room): d x nodes pairs are 800k at d = 2560
    pos = np.flatnonzero(flat > 0) if (flat >= 0).all() else np.arange(flat.size)
    for p in pos[np.argsort(-flat[pos], kind="stable")].tolist():
        j, n = divmod(p, nodes)
        if node_of[j] < 0 and used[n] < per_node:
            node_of[j] = n
            used[n] += 1
            left -= 1
            if not left:
                return node_of
    n = 0
    for j in np.flatnonzero(node_of < 0).tolist():
        while used[n] >= per_node:
            n += 1
        node_of[j] = n
        used[n] += 1
    return node_of
