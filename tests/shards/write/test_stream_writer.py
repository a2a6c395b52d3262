"""One process writing several streams (shards/write/stream_writer.py's ``StreamWriter``), against
the reference of each stream written alone (``write_stream``: its own store and threads,
waiting for its shards before returning).

Planted bugs this catches: a stream waiting for its last shard's fsync before the next stream
is encoded (the writer's old pace: the encoding thread idle while the disk syncs), the bound
on bytes waiting for the writer thread kept per shard instead of across them (unbounded memory
on a slow disk with many small shards), an input's index rebuilt for every stream (a 1M-line
JSONL read once per DP rank), and pipelined streams whose bytes or sidecars differ from a
stream written alone; a re-run after a kill at every shard not byte-identical to an
uninterrupted run (resuming at the wrong step), and a group's recorded byte span (what a
nightly copies it by) not holding exactly its samples."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

import shards.write.stream_writer as sw
from dataprep import read_cost_table
from shards.write.plan_input import read_plan
from shards.write.stream_resume import shard_stem
from shards.write.stream_writer import StreamWriter, write_stream
from shards.write.write_jobs import stream_jobs
from shards.write.writer import WriteConfig


def _stream_jobs(gen_inputs, stage: Path, shard_size: int = 60_000) -> list[dict]:
    _, cost, plan_dir = gen_inputs
    cfg = WriteConfig(
        plan_dir=str(plan_dir), cost_table=str(cost), out=str(stage), shard_size=shard_size
    )
    table = read_cost_table(cost)
    plan, _, nodes, per, where = read_plan(plan_dir, table, str(cost))
    return stream_jobs(plan, table, where, stage, cfg, {}, nodes, per)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_streams_are_encoded_while_earlier_shards_still_sync_and_match_streams_alone(
    gen_inputs, tmp_path, monkeypatch
):
    alone = [write_stream(job) for job in _stream_jobs(gen_inputs, tmp_path / "alone")]
    gate = threading.Event()
    real_fsync = os.fsync

    def held_fsync(fd):  # the disk holds every fsync until the test lets it go
        gate.wait(timeout=60)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)
    jobs = _stream_jobs(gen_inputs, tmp_path / "together")
    futures, encoded = [], threading.Event()
    with StreamWriter() as w:

        def encode():
            futures.extend(w.submit(job) for job in jobs)
            encoded.set()

        t = threading.Thread(target=encode)
        t.start()
        try:  # every stream is encoded while the first shard's fsync is still held
            assert encoded.wait(timeout=10), "a stream waited for its shards' fsync"
            assert not any(f.done() for f in futures)
        finally:
            gate.set()
            t.join()
        together = [f.result(timeout=30) for f in futures]
    assert together == alone
    assert _tree(tmp_path / "together") == _tree(tmp_path / "alone")


def test_bytes_waiting_for_the_writer_thread_are_bounded_across_shards(
    gen_inputs, tmp_path, monkeypatch
):
    # 2 KiB shards (below): each shard's bytes are one batch, queued as the shard is finished,
    # so a bound kept per shard never stops the encoder
    monkeypatch.setattr(sw._ShardFile, "_INFLIGHT", 4)
    gate = threading.Event()
    real = sw._ShardFile._write_chunks
    queued = []

    def held(self, chunks):  # a disk that does not take a byte until the test lets it go
        gate.wait(timeout=60)
        real(self, chunks)

    def counted(self):
        queued.append(1)
        real_queue(self)

    real_queue = sw._ShardFile._queue
    monkeypatch.setattr(sw._ShardFile, "_write_chunks", held)
    monkeypatch.setattr(sw._ShardFile, "_queue", counted)
    jobs = _stream_jobs(gen_inputs, tmp_path / "g", shard_size=2048)
    outcome = {}

    def run():
        with StreamWriter() as w:
            outcome["sidecars"] = [w.submit(job).result(timeout=30) for job in jobs]

    t = threading.Thread(target=run)
    t.start()
    try:
        time.sleep(0.5)
        # the writer thread holds one batch, 3 more wait; the encoder stops in its 5th
        # hand-over (at most 4 in flight: a bound of 5 lets a 6th call in)
        assert t.is_alive() and len(queued) <= 5, len(queued)
    finally:
        gate.set()
        t.join(timeout=60)
    assert not t.is_alive() and len(outcome["sidecars"]) == len(jobs)
    assert sum(len(s) for s in outcome["sidecars"]) > 8  # many shards, so many sinks


def test_one_record_store_serves_every_stream_of_a_process(gen_inputs, tmp_path, monkeypatch):
    built = []
    real = sw.RecordStore._jsonl_index

    def counting(self, path):
        if path not in self._lines:
            built.append(path)
        return real(self, path)

    monkeypatch.setattr(sw.RecordStore, "_jsonl_index", counting)
    jobs = _stream_jobs(gen_inputs, tmp_path / "g")
    with StreamWriter() as w:
        for f in [w.submit(job) for job in jobs]:
            f.result(timeout=30)
    assert len(jobs) == 4 and len(built) == 1  # the demo's one JSONL, indexed once


def test_a_stream_that_cannot_be_read_raises_at_submit_and_earlier_streams_complete(
    gen_inputs, tmp_path, monkeypatch
):
    jobs = _stream_jobs(gen_inputs, tmp_path / "g")
    bad = jobs[1]["rows"].column("sample_id")[0].as_py()
    real = sw.read_sample

    def failing(s, *args):
        if s["sample_id"] == bad:
            raise sw.WriteError(f"sample {bad!r} cannot be read any more")
        return real(s, *args)

    monkeypatch.setattr(sw, "read_sample", failing)
    with StreamWriter() as w:
        first = w.submit(jobs[0])
        with pytest.raises(sw.WriteError, match="cannot be read any more"):
            w.submit(jobs[1])
    assert first.result(timeout=30) == write_stream(_stream_jobs(gen_inputs, tmp_path / "ref")[0])


def _shards(job: dict) -> list[Path]:
    return sorted((Path(job["stage"]) / job["dir"]).glob("shard-*.tar"))


@pytest.mark.parametrize(("stream", "shard_size"), [(0, 4096), (3, 150_000)])
def test_a_rerun_keeps_each_finished_prefix_and_ends_byte_identical(
    gen_inputs, tmp_path, stream, shard_size
):
    """A run killed after its k-th shard leaves k shards with their sidecars (and a stale
    ``.partial``); the re-run keeps those k files as they are (not rewritten) and writes the
    rest from the next step on: the tree and the sidecars equal an uninterrupted run's, for
    every k (bugs: resuming at the last kept step again, or two steps back, duplicates or drops
    a group; a stream directory that already exists refused)."""
    ref_job = _stream_jobs(gen_inputs, tmp_path / "ref", shard_size=shard_size)[stream]
    ref = write_stream(ref_job)
    ref_tree = _tree(tmp_path / "ref")
    n = len(ref)
    assert n >= 4, n
    several = sum(len(side["groups"]) > 1 for side in ref)  # a last group past the first
    assert several >= (2 if shard_size > 4096 else 0), [len(x["groups"]) for x in ref]
    for k in range(n):
        stage = tmp_path / f"k{k}"
        job = _stream_jobs(gen_inputs, stage, shard_size=shard_size)[stream]
        write_stream(job)
        sdir, parts = stage / job["dir"], stage / ".parts" / job["dir"]
        for shard in _shards(job)[k:]:
            shard.unlink()
            (parts / (shard.stem + ".json")).unlink()
        kept = {p.name: p.stat().st_ino for p in _shards(job)}
        assert len(kept) == k
        (sdir / "shard-999999.tar.partial").write_bytes(b"half a shard")
        # a shard past the end (a run with smaller shards, or an older naming): removed
        (sdir / f"{shard_stem(job, n + 3)}.tar").write_bytes(b"a stale shard")
        assert write_stream(job) == ref, k
        assert _tree(stage) == ref_tree, k
        assert {p.name: p.stat().st_ino for p in _shards(job)[:k]} == kept, k


def test_each_groups_recorded_span_holds_exactly_its_samples(gen_inputs, tmp_path):
    """A sidecar's ``[step, samples, start, length]`` per group: the groups tile the shard
    from byte 0 in order, and the bytes of each span, read as a tar, are that group's samples
    (what a nightly copies a group by; a wrong length copies a neighbour's bytes)."""
    import io
    import tarfile

    several = 0
    for job in _stream_jobs(gen_inputs, tmp_path / "g", shard_size=400_000):
        for side in write_stream(job):
            several += len(side["groups"]) > 2
            data = (tmp_path / "g" / side["file"]).read_bytes()
            end = 0
            for step, count, start, length in side["groups"]:
                assert start == end and length > 0
                end = start + length
                with tarfile.open(fileobj=io.BytesIO(data[start:end] + b"\0" * 1024)) as part:
                    names = [m.name for m in part.getmembers()]
                keys = {name.split(".", 1)[0] for name in names}
                assert len(keys) == count, (side["file"], step)
                assert all(key.startswith(f"{step:07d}_") for key in keys)
            assert end <= len(data) and not any(data[end:])  # the archive's end: zeros only
    assert several  # shards of several groups: a span past the first is checked


def _with(job: dict, **columns) -> dict:
    rows = job["rows"]
    for name, values in columns.items():
        rows = rows.set_column(rows.schema.get_field_index(name), name, pa.array(values))
    return {**job, "rows": rows}


def test_each_plan_group_is_one_group_of_the_stream_in_consecutive_shards(gen_inputs, tmp_path):
    """The sidecars list the plan's groups in order, one entry per group with its sample count
    (group ids past the small integers Python keeps once: compared by value, not identity),
    in shards numbered 0, 1, 2 ... with no gap."""
    job = _stream_jobs(gen_inputs, tmp_path / "g", shard_size=150_000)[3]
    ids = [g + 1_000_003 for g in job["rows"].column("group_id").to_pylist()]
    job = _with(job, group_id=ids)
    sidecars = write_stream(job)
    steps = job["rows"].column("step").to_pylist()
    want = []
    for key in zip(steps, ids, strict=True):
        if want and want[-1][0] == key:
            want[-1][1] += 1
        else:
            want.append([key, 1])
    got = [[step, count] for side in sidecars for step, count, _, _ in side["groups"]]
    assert got == [[step, count] for (step, _), count in want]
    names = [Path(side["file"]).name for side in sidecars]
    assert names == [f"{shard_stem(job, k)}.tar" for k in range(len(sidecars))]
    assert [int(n.rsplit("-", 1)[1].split(".")[0]) for n in names] == list(range(len(names)))


@pytest.mark.parametrize("row", [0, 1])
def test_a_location_that_now_holds_another_sample_is_refused(gen_inputs, tmp_path, row):
    """Row 0 pointed at row 1's record, or row 1 at row 0's (the other sample's id sorting
    after, or before, the planned one: compared for equality)."""
    job = _stream_jobs(gen_inputs, tmp_path / "g")[0]
    where = job["rows"].column("location").to_pylist()
    ids = job["rows"].column("sample_id").to_pylist()
    other = 1 - row
    where[row] = where[other]
    with pytest.raises(
        sw.WriteError, match=rf"now holds {ids[other]!r}, the plan expects {ids[row]!r}"
    ):
        write_stream(_with(job, location=where))


def test_a_stream_with_other_read_options_gets_a_store_of_its_own(gen_inputs, tmp_path):
    """One process, two streams: the second's read options (an image root with nothing in
    it) are its own, not the first stream's store reused."""
    good, other = _stream_jobs(gen_inputs, tmp_path / "g")[:2]
    empty = tmp_path / "empty"
    empty.mkdir()
    other = {**other, "read_options": {**other["read_options"], "image_root": str(empty)}}
    with StreamWriter() as w:
        w.submit(good).result(timeout=30)
        with pytest.raises(sw.WriteError, match="cannot be read any more"):
            w.submit(other)


def test_a_nights_kept_groups_are_copied_from_the_parent_not_encoded_again(tmp_path, monkeypatch):
    """A nightly rebalance keeps the parent's balanced steps: every group of a kept step (the
    parent's step 0 included: the first night's seed 1 keeps it) is copied from the parent's
    shard bytes, one copy per group and rank; only new and re-packed groups are encoded from
    their samples."""
    import pyarrow.parquet as pq

    from shards.nightly.rebalance import run_rebalance
    from tests.shards.night_helpers import _night, first_night

    root = first_night(tmp_path, seed=1)

    copied = []
    real = sw.copy_group

    def counting(tf, g, rank):
        copied.append((rank, g["step"]))
        return real(tf, g, rank)

    monkeypatch.setattr(sw, "copy_group", counting)
    r = run_rebalance(_night(root, 2))
    assert r.status == "published" and r.plan["kept_steps"] > 0
    assert len(copied) == len(set(copied)) == r.plan["kept_steps"] * 4  # dp 4
    parent_steps = set(
        pq.read_table(root / r.generation / "plan.parquet")["parent_step"].to_pylist()
    )
    assert 0 in parent_steps


def _planned(job: dict, i: int = 0) -> dict:
    row = job["rows"].slice(i, 1).to_pylist()[0]
    return {**row, "parent": None}


@pytest.mark.parametrize("key", ["0" * 32, "f" * 32])
def test_a_cache_key_that_differs_either_way_checks_the_fingerprint(gen_inputs, tmp_path, key):
    """The cache key says the record and its files are as prep saw them; only then is the
    fingerprint check skipped. A key that differs (sorting below or above the file's: compared
    for equality, not order) re-checks, and a fingerprint that no longer matches is refused."""
    job = _stream_jobs(gen_inputs, tmp_path / "g")[0]
    store = sw.RecordStore(sw.ReadOptions(**job["read_options"]))
    try:
        s = _planned(job)
        assert sw.read_sample({**s, "fingerprint": "0" * 32}, store, {})  # the key matches
        stale = {**s, "cache_key": f"{key}.seal", "fingerprint": "0" * 32}
        with pytest.raises(sw.WriteError, match="changed since prep measured it"):
            sw.read_sample(stale, store, {})
        assert sw.read_sample({**s, "cache_key": f"{key}.seal"}, store, {})  # re-checked: same
    finally:
        store.close()


def test_a_shard_is_closed_once_it_reaches_the_shard_size(gen_inputs, tmp_path):
    """``shard_size`` bytes reached (at, not only past it) closes the shard after that group;
    one byte short, the next group joins it."""
    whole = write_stream(_stream_jobs(gen_inputs, tmp_path / "whole", shard_size=1 << 30)[3])
    _, _, start, length = whole[0]["groups"][0]
    first_end = start + length  # the archive's offset after the first group
    for size, groups in ((first_end, 1), (first_end + 1, 2), (first_end - 1, 1)):
        job = _stream_jobs(gen_inputs, tmp_path / f"s{size}", shard_size=size)[3]
        got = write_stream(job)
        assert len(got[0]["groups"]) == groups, (size, got[0]["groups"])


def test_leaving_the_writer_waits_for_its_shards_and_closes_its_store(
    gen_inputs, tmp_path, monkeypatch
):
    closed = []
    real = sw.RecordStore.close
    monkeypatch.setattr(sw.RecordStore, "close", lambda self: (closed.append(1), real(self))[1])
    job = _stream_jobs(gen_inputs, tmp_path / "g")[0]
    with StreamWriter() as w:
        future = w.submit(job)  # not waited for here
    assert future.done() and closed == [1]
    assert all((tmp_path / "g" / side["file"]).is_file() for side in future.result())
    with StreamWriter():
        pass  # no stream, no store: nothing to close


def test_a_write_that_fails_renames_no_shard_and_fails_the_stream(
    gen_inputs, tmp_path, monkeypatch
):
    """A disk that fills up while the last bytes of a shard are written: the stream's future
    fails with that error, and no shard of it is renamed to its final name or recorded."""
    from tests.shards.full_disk import FullDisk

    real = sw.open_new
    monkeypatch.setattr(sw, "open_new", lambda path: FullDisk(real(path)))
    job = _stream_jobs(gen_inputs, tmp_path / "g", shard_size=1 << 30)[0]
    with StreamWriter() as w:
        future = w.submit(job)
        with pytest.raises(OSError, match="No space left"):
            future.result(timeout=30)
    assert not list((tmp_path / "g").rglob("*.tar")) and not list((tmp_path / "g").rglob("*.json"))
