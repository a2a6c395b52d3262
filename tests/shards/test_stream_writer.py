"""One process writing several streams (shards/stream_writer.py's ``StreamWriter``), against
the reference of each stream written alone (``write_stream``: its own store and threads,
waiting for its shards before returning).

Planted bugs this catches: a stream waiting for its last shard's fsync before the next stream
is encoded (the writer's old pace: the encoding thread idle while the disk syncs), the bound
on bytes waiting for the writer thread kept per shard instead of across them (unbounded memory
on a slow disk with many small shards), an input's index rebuilt for every stream (a 1M-line
JSONL read once per DP rank), and pipelined streams whose bytes or sidecars differ from a
stream written alone."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import shards.stream_writer as sw
from dataprep import read_cost_table
from shards.plan_input import read_plan
from shards.stream_writer import StreamWriter, write_stream
from shards.write_jobs import stream_jobs
from shards.writer import WriteConfig


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
        # the writer thread holds one batch; the encoder stops once 4 more wait
        assert t.is_alive() and len(queued) <= 4 + 2, len(queued)
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
