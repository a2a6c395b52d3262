"""Run a function on N ranks of a real process group (gloo; NCCL with one GPU per rank), under a
timeout (a hang fails).

Ranks are started by a fork server that has imported torch, transformers' model base and
equishard's packages, and loaded the runtime numba kernels, once for the whole test session
(tests/rank_preload.py): a fresh, single-threaded process, so each rank starts as clean as a
spawned one without importing them again (most of a small multi-rank test's time on a 2-core
machine). Each rank gets the caller's environment of the moment, as a spawned one would,
and the platform's start method for its own processes (a DataLoader's workers fork from the
rank, as under torchrun, not from a fork server of their own),
and one compute thread, as torchrun gives each rank by default (OMP_NUM_THREADS=1): N ranks
with a thread per core each oversubscribe the cores, and a kernel made of many small parallel
regions (a depthwise conv in float64 runs one per channel) then crawls where the cores are
busy or CPU time is capped.

A failing run says why on any machine: the ranks meet through a file store (no TCP port picked
in advance that another process can take before rank 0 binds it); a rank that dies without a
result (killed for memory, a crash) is named with its exit code at once; after one rank's error
the others get a short grace, not the whole timeout (they may wait in a collective for it); on a
timeout, each hanging rank's Python stack is part of the failure. A rank's result travels
pickled through a pipe and is held by the caller: one over ``max_result_bytes`` is refused
(compare on the ranks and return the verdict, not the tensors)."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue as q
import re
import signal
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

MAX_RESULT_BYTES = 512 << 20  # per rank; the default of run_ranks' max_result_bytes
GRACE_S = 20.0  # how long the other ranks get after one rank's error
RANK_THREADS = 1  # torch's compute threads in each rank (torchrun's default)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["tests.rank_preload"])  # what every rank needs, imported once


def _entry(fn, rank, world, queue, args, run):
    import faulthandler

    import torch
    import torch.distributed as dist

    os.environ.clear()
    os.environ.update(run.env)
    torch.set_num_threads(RANK_THREADS)
    # a forkserver's child inherits "forkserver" as its start method: a rank's DataLoader
    # workers would each start a fresh fork server (an interpreter importing torch: ~8 s a
    # rank); a torchrun rank has the platform's default
    mp.set_start_method(None, force=True)
    with open(run.stacks[rank], "w") as dump:
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
        try:
            if run.backend == "nccl":
                torch.cuda.set_device(rank)
            if run.port:  # the caller's own init_process_group() meets as under torchrun
                os.environ.update(
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(world),
                    LOCAL_WORLD_SIZE=str(world),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(run.port),
                )
            else:  # a collective that waits past the run's timeout raises here, naming itself
                dist.init_process_group(
                    run.backend,
                    init_method=f"file://{run.store}",
                    rank=rank,
                    world_size=world,
                    timeout=datetime.timedelta(seconds=run.timeout),
                )
            # pickled by value here: a tensor put on the queue as is travels as a shared-memory
            # handle that the parent can only open while this process lives (a race at exit)
            value = pickle.dumps(fn(rank, world, *args))
            if len(value) > run.max_bytes:
                raise ValueError(
                    f"the result is {len(value) >> 20} MiB pickled (at most "
                    f"{run.max_bytes >> 20} MiB): compare on the ranks and return the verdict"
                )
            queue.put((rank, "ok", value))
        except BaseException:
            queue.put((rank, "error", traceback.format_exc()))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


@dataclass(frozen=True)
class _Run:
    """What every rank of one run is started with."""

    env: dict
    store: Path
    stacks: list[Path]
    backend: str
    timeout: float
    max_bytes: int
    port: int  # 0: the group is made for ``fn``; else torchrun's variables, MASTER_PORT this


def _stack(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(lines[-60:]) or "(no stack: the rank did not answer the signal)"


def run_ranks(
    fn,
    world: int,
    *args,
    timeout: float = 120.0,
    backend: str = "gloo",
    max_result_bytes: int = MAX_RESULT_BYTES,
    torchrun_env: bool = False,
) -> list:
    """``fn(rank, world, *args)`` on every rank; returns results by rank. ``fn`` must be importable.
    ``torchrun_env``: no process group is made for ``fn``; each rank gets the variables torchrun
    sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``), so a
    training script's own ``init_process_group()`` runs as it does under torchrun."""
    for attempt in range(2):
        try:
            return _run_once(
                fn,
                world,
                *args,
                timeout=timeout,
                backend=backend,
                max_result_bytes=max_result_bytes,
                torchrun_env=torchrun_env,
            )
        except AssertionError as exc:
            # the group's TCP mesh failing to form before ``fn`` ran (a port another process
            # took between gloo's listen and its peer's connect): nothing of the test ran, so
            # it runs again once with a fresh store; any other error is the test's
            if attempt or not _MESH_FAILED.search(str(exc)):
                raise
    raise AssertionError("unreachable")


_MESH_FAILED = re.compile(r"in _entry\n\s+dist\.init_process_group\([\s\S]*connectFullMesh failed")


def _run_once(
    fn,
    world: int,
    *args,
    timeout: float = 120.0,
    backend: str = "gloo",
    max_result_bytes: int = MAX_RESULT_BYTES,
    torchrun_env: bool = False,
) -> list:
    """One run of :func:`run_ranks`."""
    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        queue = _CTX.Queue()
        stacks = [Path(tmp, f"stack{r}.txt") for r in range(world)]
        port = free_port() if torchrun_env else 0
        env, store = dict(os.environ), Path(tmp, "store")
        run = _Run(env, store, stacks, backend, timeout, max_result_bytes, port)
        procs = [
            _CTX.Process(target=_entry, args=(fn, r, world, queue, args, run)) for r in range(world)
        ]
        for p in procs:
            p.start()
        results, errors = {}, {}
        hung: set[int] = set()  # past the deadline: stuck, never joined, killed at once
        deadline = time.monotonic() + timeout
        grace = min(GRACE_S, timeout)
        try:
            while pending := [r for r in range(world) if r not in results and r not in errors]:
                if time.monotonic() >= deadline:
                    for r in pending:
                        if procs[r].is_alive():
                            os.kill(procs[r].pid, signal.SIGUSR1)
                    until = time.monotonic() + 2  # their stacks written (at most 2 s)
                    while time.monotonic() < until and not all(
                        stacks[r].exists() and stacks[r].stat().st_size for r in pending
                    ):
                        time.sleep(0.05)
                    time.sleep(0.1)  # the dump's last lines
                    what = "still running after another's error" if errors else "timed out"
                    for r in pending:
                        errors[r] = f"{what} after {timeout:.0f} s; its stack:\n{_stack(stacks[r])}"
                    hung.update(pending)
                    break
                # a rank that had ended before this wait and sends nothing in it never will
                # (its result, if any, was in the pipe before it could exit)
                ended = [r for r in pending if procs[r].exitcode is not None]
                try:
                    rank, status, value = queue.get(timeout=1.0)
                except q.Empty:
                    for r in ended:  # killed for memory, a crash
                        code = procs[r].exitcode
                        errors[r] = f"ended with exit code {code} and no result" + (
                            " (killed by a signal: out of memory?)" if code < 0 else ""
                        )
                        deadline = min(deadline, time.monotonic() + grace)
                    continue
                if status == "ok":
                    results[rank] = pickle.loads(value)
                else:
                    errors[rank] = value
                    deadline = min(deadline, time.monotonic() + grace)
        finally:
            for r, p in enumerate(procs):
                if (r in results or r in errors) and r not in hung:  # it answered: let it
                    p.join(timeout=5)  # end its group (a hung rank would only use up the 5 s)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    if errors:
        raise AssertionError("\n".join(f"rank {r}: {errors[r]}" for r in sorted(errors)))
    return [results[r] for r in range(world)]
