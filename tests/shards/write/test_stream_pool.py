"""The writer's process pool (shards/write/stream_pool.py) against a reference model of it: every
job's result exactly once, keyed by its rank, whichever process ran it; the calling process
writes streams too (from the back) while the spawned workers take them from the front; the
first error, a worker's or the caller's, is raised and no stream starts after it; at most half
the usable cores' processes run.

Planted bugs this catches: the caller only waiting (``--workers 2`` slower than 1, the old
pool), a result filed under another job's rank, a worker's error swallowed, streams still
started after an error, a job run twice."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from shards.write import stream_pool
from shards.write.stream_pool import run_streams, stream_processes


def record(job: dict) -> list[dict]:
    """A stream that says who wrote it (a spawned worker imports this module by name). The
    caller's streams first wait (up to a minute) until a spawned worker has started one: on a
    busy machine a worker's start-up can outlast all of the caller's streams."""
    if os.getpid() == job["caller"]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            not p.name.endswith(f"-{job['caller']}") for p in Path(job["log"]).iterdir()
        ):
            time.sleep(0.01)
    Path(job["log"], f"{job['rank']}-{os.getpid()}").touch()
    time.sleep(job.get("sleep", 0.0))
    if job.get("fail"):
        raise ValueError(f"stream {job['rank']} failed")
    return [{"rank": job["rank"], "pid": os.getpid()}]


def _jobs(tmp_path: Path, n: int, **extra) -> list[dict]:
    base = {"log": str(tmp_path), "sleep": 0.05, "caller": os.getpid()}
    return [{"rank": r, **base, **extra} for r in range(n)]


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(stream_pool, "usable_cores", lambda: 8)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_stream_once_under_its_rank_and_the_caller_writes_too(tmp_path, workers, eight_cores):
    jobs = _jobs(tmp_path, 24)
    if workers == 1:  # no worker to wait for
        jobs = [{**job, "caller": -1} for job in jobs]
    ticks = []
    got = run_streams(jobs, workers, record, lambda: ticks.append(1))
    assert sorted(got) == list(range(24)) and len(ticks) == 24
    assert all(got[r][0]["rank"] == r for r in got)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert [int(n.split("-")[0]) for n in written] == sorted(range(24), key=str)  # each once
    pids = {got[r][0]["pid"] for r in got}
    assert os.getpid() in pids  # the caller wrote streams
    if workers == 1:
        assert pids == {os.getpid()}
    else:  # the caller takes from the back: the last stream is its own
        assert got[23][0]["pid"] == os.getpid()
        assert len(pids) > 1, "no spawned worker wrote a stream"


def test_a_workers_error_is_raised_and_no_stream_starts_after_it(tmp_path, eight_cores):
    # every stream fails, the caller's from the back included: whichever fails first is raised
    jobs = _jobs(tmp_path, 40, fail=True, caller=-1)
    with pytest.raises(ValueError, match=r"stream \d+ failed"):
        run_streams(jobs, 2, record, lambda: None)
    # at most the streams already running when the first failed, far from all 40
    assert len(list(tmp_path.iterdir())) <= 4


def test_a_workers_error_reaches_the_caller(tmp_path, eight_cores):
    jobs = _jobs(tmp_path, 6)
    jobs[0]["fail"] = True  # the front: a spawned worker's first stream
    jobs[0]["sleep"] = 0.0
    for job in jobs[1:]:
        job["sleep"] = 0.5  # the caller, started once the worker has, still writes as it fails
    with pytest.raises(ValueError, match="stream 0 failed"):
        run_streams(jobs, 2, record, lambda: None)


@pytest.mark.parametrize(
    ("cores", "workers", "streams", "want"),
    [(2, 2, 8, 1), (2, 4, 8, 1), (4, 4, 8, 2), (16, 4, 8, 4), (16, 8, 3, 3), (1, 2, 8, 1)],
)
def test_processes_are_capped_at_half_the_usable_cores(monkeypatch, cores, workers, streams, want):
    """A stream keeps two cores busy: on 2 cores a second process only contended (--workers 2
    was slower than 1 in BENCHMARKS.md)."""
    monkeypatch.setattr(stream_pool, "usable_cores", lambda: cores)
    assert stream_processes(workers, streams) == want


def test_on_two_cores_workers_2_runs_in_this_process_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_pool, "usable_cores", lambda: 2)
    jobs = [{**job, "caller": -1} for job in _jobs(tmp_path, 6)]
    got = run_streams(jobs, 2, record, lambda: None)
    assert {got[r][0]["pid"] for r in got} == {os.getpid()}


def test_equishard_cores_overrides_the_cores_seen(monkeypatch):
    monkeypatch.setenv("EQUISHARD_CORES", "6")
    assert stream_pool.usable_cores() == 6 and stream_processes(8, 10) == 3
    monkeypatch.setenv("EQUISHARD_CORES", "two")
    with pytest.raises(ValueError, match="EQUISHARD_CORES must be a whole number"):
        stream_pool.usable_cores()


def test_a_bad_equishard_cores_is_refused_before_anything_is_staged(monkeypatch, tmp_path):
    from shards.write.writer import WriteConfig

    plan = tmp_path / "plan"
    plan.mkdir()
    for f in (plan / "plan.parquet", plan / "report.json", tmp_path / "cost.parquet"):
        f.write_bytes(b"")
    monkeypatch.setenv("EQUISHARD_CORES", "0")
    kw = dict(
        plan_dir=str(plan), cost_table=str(tmp_path / "cost.parquet"), out=str(tmp_path / "o")
    )
    with pytest.raises(ValueError, match="EQUISHARD_CORES must be a whole number >= 1, got '0'"):
        WriteConfig(workers=2, **kw)
    WriteConfig(workers=1, **kw)  # one process: the cores are never asked


class _Later:
    """A ``local`` writer whose streams complete only after the next one was submitted (the
    way :class:`shards.write.stream_writer.StreamWriter` syncs a stream's last shard while the next
    is encoded); ``fail`` names a rank whose future fails."""

    def __init__(self, log: list, fail: int | None = None) -> None:
        self.log, self.fail, self.open = log, fail, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for rank, fut in self.open:
            self._complete(rank, fut)

    def _complete(self, rank, fut):
        if rank == self.fail:
            fut.set_exception(ValueError(f"stream {rank}'s sync failed"))
        else:
            fut.set_result([{"rank": rank}])
        self.log.append(("done", rank))

    def submit(self, job):
        from concurrent.futures import Future

        self.log.append(("submit", job["rank"]))
        for rank, fut in self.open:  # the one before completes while this one is encoded
            self._complete(rank, fut)
        self.open = [(job["rank"], Future())]
        return self.open[0][1]


@pytest.mark.timeout(20)  # a pool that waits for each stream before the next never returns
def test_streams_completing_after_the_next_is_submitted_are_all_filed(tmp_path):
    log, ticks = [], []
    jobs = [{**job, "caller": -1} for job in _jobs(tmp_path, 5)]
    got = run_streams(jobs, 1, record, lambda: ticks.append(1), local=lambda: _Later(log))
    assert got == {r: [{"rank": r}] for r in range(5)} and len(ticks) == 5


def test_a_late_failure_of_a_local_stream_is_raised_and_stops_new_streams(tmp_path):
    log = []
    jobs = [{**job, "caller": -1} for job in _jobs(tmp_path, 8)]
    with pytest.raises(ValueError, match="stream 1's sync failed"):
        run_streams(jobs, 1, record, lambda: None, local=lambda: _Later(log, fail=1))
    # stream 1 fails as stream 2 is submitted, and is seen at once: nothing after stream 2
    assert max(r for what, r in log if what == "submit") == 2


def test_workers_are_spawned_by_the_thread_that_outlives_the_pool(
    tmp_path, eight_cores, monkeypatch
):
    """The kernel's parent-death signal (``exit_with_parent``) follows the thread that spawned a
    worker: spawned by the feeder thread, workers were SIGKILLed as it ended, and one killed while
    holding the result queue's lock hung the pool's shutdown (seen in CI). Every worker must be
    spawned by the calling thread."""
    from concurrent.futures import ProcessPoolExecutor

    spawners = []

    class Recording(ProcessPoolExecutor):
        def _spawn_process(self):
            spawners.append(threading.current_thread().name)
            super()._spawn_process()

    monkeypatch.setattr(stream_pool, "ProcessPoolExecutor", Recording)
    jobs = _jobs(tmp_path, 12)
    got = run_streams(jobs, 3, record, lambda: None)
    assert sorted(got) == list(range(12))
    assert spawners == [threading.current_thread().name] * 2, spawners


class _Logged:
    """A ``local`` writer that notes which instance, in which process, wrote each stream (a
    spawned worker imports this module by name)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def submit(self, job):
        from concurrent.futures import Future

        Path(job["via"], f"{job['rank']}-{os.getpid()}-{id(self)}").touch()
        fut = Future()
        fut.set_result(record(job))
        return fut


def test_each_process_writes_all_its_streams_through_one_local_writer(tmp_path, eight_cores):
    """This process and every spawned worker make their ``local`` writer once and run every
    stream they take through it (the writer's record store: an input indexed once per process,
    not once per stream)."""
    log, via = tmp_path / "log", tmp_path / "via"
    log.mkdir()
    via.mkdir()
    jobs = [{**job, "via": str(via)} for job in _jobs(log, 12)]
    got = run_streams(jobs, 3, record, lambda: None, local=_Logged)
    assert sorted(got) == list(range(12))
    notes = [p.name.split("-") for p in via.iterdir()]
    assert sorted(int(rank) for rank, _, _ in notes) == list(range(12))  # all through one
    writers: dict[str, set] = {}
    for _, pid, writer in notes:
        writers.setdefault(pid, set()).add(writer)
    assert len(writers) > 1, "no spawned worker wrote a stream"
    assert all(len(w) == 1 for w in writers.values()), writers


def test_a_stuck_worker_fails_the_run_naming_its_stream(tmp_path, eight_cores):
    """Bug: a spawned worker frozen on a stream (a hung mount) hung ``write --workers N``
    forever; the local engine had no ``--task-timeout``. Now the run fails naming the stream
    once it has run ``timeout`` seconds, the workers killed."""
    jobs = _jobs(tmp_path, 2)
    jobs[0]["sleep"] = 60  # the front: a spawned worker's
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no progress for 3 s on stream 0"):
        run_streams(jobs, 2, record, lambda: None, timeout=3)
    assert time.monotonic() - t0 < 45  # not the stream's 60 s


def test_a_timeout_that_is_not_a_positive_number_is_refused(tmp_path):
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            run_streams(_jobs(tmp_path, 1), 1, record, lambda: None, timeout=bad)
