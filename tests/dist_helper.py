"""Run a function on N ranks of a real process group (gloo; NCCL with one GPU per rank), under a
timeout (a hang fails).

Ranks are started by a fork server that has imported torch (and transformers, where installed)
once for the whole test session: a fresh, single-threaded process, so each rank starts as clean
as a spawned one without importing torch again (most of a small multi-rank test's time on a
2-core machine). Each rank gets the caller's environment of the moment, as a spawned one would."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import traceback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "numpy", "transformers"])


def _entry(fn, rank, world, port, queue, args, backend, env):
    import torch.distributed as dist

    os.environ.clear()
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world)
        # pickled by value here: a tensor put on the queue as is travels as a shared-memory
        # handle that the parent can only open while this process lives (a race at exit)
        queue.put((rank, "ok", pickle.dumps(fn(rank, world, *args))))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world: int, *args, timeout: float = 120.0, backend: str = "gloo") -> list:
    """``fn(rank, world, *args)`` on every rank; returns results by rank. ``fn`` must be importable."""
    queue = _CTX.Queue()
    port = free_port()
    env = dict(os.environ)
    procs = [
        _CTX.Process(target=_entry, args=(fn, r, world, port, queue, args, backend, env))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results, errors = {}, []
    import queue as q

    try:
        for _ in range(world):
            rank, status, value = queue.get(timeout=timeout)
            if status == "ok":
                results[rank] = pickle.loads(value)
            else:
                errors.append(f"rank {rank}:\n{value}")
    except q.Empty:
        errors.append(
            f"timed out after {timeout} s: {world - len(results) - len(errors)} rank(s) hang"
        )
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
