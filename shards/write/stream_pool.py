"""The writer's streams over ``workers`` processes, this one included.

``equishard write --workers N`` used to hand every stream to N spawned processes while this one
waited: each spends its first ~0.3-0.7 s importing the writer, so on a small set two workers
were slower than one (BENCHMARKS.md). Here this process writes streams too, from the back of
the list, while spawned workers take them from the front as each becomes free: a worker that is
still starting costs nothing. One stream keeps two cores busy (this thread encodes, a writer
thread hashes and writes), so at most usable cores / 2 processes run: more only contend (on 2
cores, a second process made ``--workers 2`` slower than 1). Which process writes a stream
changes none of its bytes (:func:`shards.write.stream_writer.write_stream` depends on its job alone).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import AbstractContextManager

from equishard.common.workers import exit_with_parent, usable_cores

__all__ = ["run_streams", "stream_processes", "usable_cores"]


def stream_processes(workers: int, streams: int) -> int:
    """The processes ``--workers`` runs for ``streams`` streams, this one included."""
    return max(1, min(workers, streams, usable_cores() // 2))


# a spawned worker's own ``local`` writer, made once when the worker starts (None in this
# process and where no ``local`` is given): every stream the worker takes goes through it
_WORKER = None


def _start_worker(parent: int, local: Callable[[], AbstractContextManager] | None) -> None:
    exit_with_parent(parent)  # never outlive a killed writer (its lock is gone)
    if local is not None:
        global _WORKER
        manager = local()
        _WORKER = manager.__enter__()
        atexit.register(manager.__exit__, None, None, None)


def _in_worker(fn: Callable[[dict], list[dict]], job: dict) -> list[dict]:
    return fn(job) if _WORKER is None else _WORKER.submit(job).result()


class _AtOnce:
    """The default ``local`` of :func:`run_streams`: ``fn(job)`` run when submitted."""

    def __init__(self, fn: Callable[[dict], list[dict]]) -> None:
        self.fn = fn

    def __enter__(self) -> _AtOnce:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def submit(self, job: dict) -> Future:
        fut: Future = Future()
        fut.set_result(self.fn(job))
        return fut


def run_streams(
    jobs: list[dict],
    workers: int,
    fn: Callable[[dict], list[dict]],
    done: Callable[[], None],
    local: Callable[[], AbstractContextManager] | None = None,
    timeout: float | None = None,
) -> dict[int, list[dict]]:
    """``fn(job)`` for every job, keyed by ``job["rank"]``; ``done()`` after each. The first
    error (a worker's or this process's) is raised once the running streams end; no stream
    starts after it. With ``local`` (a context manager factory whose ``submit(job)`` returns a
    future of ``fn(job)``'s result, e.g. :class:`shards.write.stream_writer.StreamWriter`), this
    process runs its streams through one ``local()``, which may still be completing one stream
    while the next is submitted (leaving it waits for them all), and each spawned worker makes
    its own once and runs every stream it takes through it (an input's index is built once per
    process); without, both run ``fn`` once per stream.

    ``timeout``: a spawned worker's stream still running after that many seconds counts as stuck
    (a frozen process, a hung mount): the workers are killed and :class:`TimeoutError` names the
    stream. This process's own streams cannot be timed out from inside it."""
    if timeout is not None and not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
    workers = stream_processes(workers, len(jobs))
    pending = deque(jobs)
    results: dict[int, list[dict]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def take(front: bool) -> dict | None:
        with lock:
            if errors or not pending:
                return None
            return pending.popleft() if front else pending.pop()

    def file(rank: int, fut: Future) -> None:
        """A finished stream's outcome: its sidecars under its rank, or its error (a worker's,
        or its death), raised once the running streams end."""
        try:
            value = fut.result()
        except BaseException as exc:
            with lock:
                errors.append(exc)
            return
        with lock:
            results[rank] = value
        done()

    def write_here(front: bool) -> None:
        """This process's streams; each finished one is filed as soon as it is seen done."""
        submitted: deque[tuple[int, Future]] = deque()

        def file_done(wait: bool) -> None:
            while submitted and (wait or submitted[0][1].done()):
                file(*submitted.popleft())

        try:
            with (local or (lambda: _AtOnce(fn)))() as writer:
                while (job := take(front)) is not None:
                    submitted.append((job["rank"], writer.submit(job)))
                    file_done(wait=False)
        finally:
            file_done(wait=True)

    if workers == 1:
        write_here(front=True)
        if errors:
            raise errors[0]
        return results

    def feed(pool: ProcessPoolExecutor) -> None:
        """Keep each spawned worker busy with the next stream from the front."""
        running: dict[Future, tuple[int, float]] = {}  # rank, when submitted
        while True:
            while len(running) < workers - 1 and (job := take(front=True)) is not None:
                running[pool.submit(_in_worker, fn, job)] = (job["rank"], time.monotonic())
            if not running:
                return
            left = None
            if timeout is not None:
                oldest = min(t0 for _, t0 in running.values())
                left = max(0.0, oldest + timeout - time.monotonic())
            finished, _ = wait(running, timeout=left, return_when=FIRST_COMPLETED)
            for fut in finished:
                file(running.pop(fut)[0], fut)
            stuck = [
                rank
                for fut, (rank, t0) in running.items()
                if timeout is not None and time.monotonic() - t0 >= timeout and not fut.done()
            ]
            if stuck:
                with lock:
                    errors.append(
                        TimeoutError(
                            f"a write worker made no progress for {timeout:g} s on stream "
                            f"{min(stuck)} (a hung mount or a frozen process?)"
                        )
                    )
                for proc in list(getattr(pool, "_processes", {}).values()):
                    proc.kill()  # a frozen worker is not waited for
                return

    with ProcessPoolExecutor(
        workers - 1,
        mp_context=mp.get_context("spawn"),
        initializer=_start_worker,
        initargs=(os.getpid(), local),
    ) as pool:
        # a worker is spawned by the thread that submits to the pool, and the kernel's
        # parent-death signal (exit_with_parent) follows that *thread*: spawned by the feeder,
        # the workers were SIGKILLed when it ended, one perhaps still holding the result queue's
        # lock (the others then hung at shutdown). So all are spawned here, by the thread that
        # outlives the pool, with a task that returns at once (nobody waits for it)
        for _ in range(workers - 1):
            pool.submit(os.getpid)
        feeder = threading.Thread(target=feed, args=(pool,), name="equishard-write-feeder")
        feeder.start()
        try:
            write_here(front=False)  # this process: from the back
        except BaseException as exc:
            with lock:
                errors.append(exc)
        finally:
            feeder.join()  # the workers' running streams end; no new one starts after an error
    if errors:
        raise errors[0]
    return results
