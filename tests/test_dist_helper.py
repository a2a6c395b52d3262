"""The multi-rank helper's failures say what happened, quickly: a rank's error with its
traceback (the other rank, waiting in a collective for it, does not hold the run to its
timeout), a rank that dies without a result named with its exit code, a hang with the hanging
rank's stack, a result too large to carry refused. Each run here is a few seconds."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.dist_helper import run_ranks


def _sum(rank, world):
    import torch
    import torch.distributed as dist

    x = torch.tensor([rank + 1.0])
    dist.all_reduce(x)
    return float(x)


def _rank1_raises(rank, world):
    import torch
    import torch.distributed as dist

    if rank == 1:
        raise KeyError("planted on rank 1")
    dist.all_reduce(torch.ones(1))  # waits for rank 1, which never comes


def _rank1_dies(rank, world):
    import torch
    import torch.distributed as dist

    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer does
    dist.all_reduce(torch.ones(1))  # waits for rank 1


def _rank0_sleeps_in_a_named_function(rank, world):
    if rank == 0:
        _wait_forever()


def _wait_forever():
    time.sleep(600)


def _huge(rank, world):
    import torch

    return torch.zeros(9 << 20, dtype=torch.float64)  # 72 MiB


def _threads(rank, world):
    import torch

    return torch.get_num_threads()


def test_results_by_rank():
    assert run_ranks(_sum, 3, timeout=60) == [6.0, 6.0, 6.0]


def _start_method(rank, world):
    import multiprocessing as mp

    return mp.get_start_method()


def test_a_rank_starts_its_workers_as_a_torchrun_rank_does():
    """A rank's start method for its own processes (DataLoader workers) is a fresh
    interpreter's, not the fork server's it came from (with which each rank's loader started a
    fork server of its own: seconds per rank)."""
    import subprocess
    import sys

    code = "import multiprocessing as mp; print(mp.get_start_method())"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run_ranks(_start_method, 2, timeout=60) == [fresh.stdout.strip()] * 2


def test_each_rank_computes_on_one_thread():
    """As under torchrun: ranks sharing the cores do not oversubscribe them."""
    assert run_ranks(_threads, 2, timeout=60) == [1, 1]


def test_an_error_fails_fast_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(AssertionError) as e:
        run_ranks(_rank1_raises, 2, timeout=300)
    assert "rank 1:" in str(e.value) and "KeyError: 'planted on rank 1'" in str(e.value)
    assert time.monotonic() - start < 120, "waited for the timeout, not the grace"


def test_a_rank_killed_is_named_with_its_exit_code():
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"rank 1: ended with exit code -9 and no result"):
        run_ranks(_rank1_dies, 2, timeout=300)
    assert time.monotonic() - start < 120


def test_a_hang_shows_the_hanging_ranks_stack():
    with pytest.raises(AssertionError) as e:
        run_ranks(_rank0_sleeps_in_a_named_function, 2, timeout=8)
    assert "rank 0: timed out after 8 s" in str(e.value)
    assert "_wait_forever" in str(e.value)


def test_a_result_too_large_to_carry_is_refused():
    with pytest.raises(AssertionError, match=r"72 MiB pickled \(at most 64 MiB\): compare on"):
        run_ranks(_huge, 1, timeout=60, max_result_bytes=64 << 20)


MESH_FAILURE = """rank 0: Traceback (most recent call last):
  File "/x/tests/dist_helper.py", line 82, in _entry
    dist.init_process_group(
  File "/x/torch/distributed/distributed_c10d.py", line 2169, in _new_process_group_helper
    backend_class = ProcessGroupGloo(
RuntimeError: Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer"""


def test_a_group_that_fails_to_form_before_the_test_ran_is_formed_again_once(monkeypatch):
    """Seen once in CI: gloo's TCP mesh failed to form (a peer's port taken in between) before
    ``fn`` ran. That run is made again, once; an error of the test itself never is."""
    import tests.dist_helper as helper

    calls = []

    def flaky(fn, world, *args, **kw):
        calls.append(fn)
        if len(calls) == 1:
            raise AssertionError(MESH_FAILURE)
        return ["ok"] * world

    monkeypatch.setattr(helper, "_run_once", flaky)
    assert helper.run_ranks(_threads, 2) == ["ok", "ok"] and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(
        helper, "_run_once", lambda *a, **k: (_ for _ in ()).throw(AssertionError(MESH_FAILURE))
    )
    with pytest.raises(AssertionError, match="connectFullMesh"):  # twice: not hidden
        helper.run_ranks(_threads, 2)

    def test_error(fn, world, *args, **kw):
        calls.append(fn)
        raise AssertionError("rank 1: KeyError: 'planted'\nconnectFullMesh failed later")

    monkeypatch.setattr(helper, "_run_once", test_error)
    with pytest.raises(AssertionError, match="planted"):
        helper.run_ranks(_threads, 2)
    assert len(calls) == 1  # the test's own error: no second run


def test_a_test_workers_torch_takes_its_share_of_the_cores(pytestconfig):
    """Bug: the process that starts xdist's workers set OMP_NUM_THREADS to its own share (all
    cores) before starting them, and they inherit its environment: 2 threads in each of 2
    workers on 2 cores, two tests' torch kernels side by side ran up to 9x slower. Each worker
    takes the cores over the workers (in a single process: all of them)."""
    import torch

    from tests.conftest import THREADS_SET_HERE, usable_cores

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if THREADS_SET_HERE not in os.environ:
        pytest.skip("OMP_NUM_THREADS was set outside the run: it is kept")
    assert torch.get_num_threads() == max(1, usable_cores() // workers)
