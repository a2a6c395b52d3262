"""``--engine ray``: prep, write and rebalance on a local Ray cluster (2 CPUs, started here) give
the same bytes as local runs; a write task killed mid-stream is retried and still byte-identical."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataprep import PrepConfig, run_prep
from shards.errors import WriteError
from shards.nightly.rebalance import run_rebalance
from shards.write.writer import WriteConfig, write_generation
from tests.shards.conftest import build_inputs
from tests.shards.night_helpers import _night

ray = pytest.importorskip("ray")

from tests.conftest import local_ray_cluster  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    yield from local_ray_cluster()


def _same_tree(a: Path, b: Path) -> None:
    """Every file of ``a`` and ``b`` (hidden ones too) exists in both with the same bytes."""
    assert any(a.rglob("*.tar"))
    fa = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert fa == fb
    diff = [f for f in fa if not filecmp.cmp(a / f, b / f, shallow=False)]
    assert not diff, f"files differ: {diff[:5]}"


def test_prep_on_ray_equals_local(cluster, tmp_path):
    """The CLI on the running cluster (--ray-address) writes the same cost and errors tables,
    byte for byte, as a local run with worker processes; bad records are counted the same."""
    demo, _, _ = build_inputs(tmp_path, samples=60)
    src = demo / "demo.jsonl"
    lines = src.read_text().splitlines()
    broken = demo / "mixed.jsonl"  # two bad records among the good ones
    broken.write_text(
        "\n".join([*lines[:20], "{not json", *lines[20:40], "[]", *lines[40:]]) + "\n"
    )
    common = dict(
        inputs=(str(broken),),
        tokenizer=str(demo / "tokenizer.json"),
        chunk_size=7,
        max_error_rate=0.1,
    )
    local = run_prep(PrepConfig(output=str(tmp_path / "local.parquet"), workers=2, **common))
    out = tmp_path / "ray.parquet"
    proc = subprocess.run(
        [sys.executable, "-m", "equishard", "prep", str(broken), "--tokenizer",
         str(demo / "tokenizer.json"), "--chunk-size", "7", "--workers", "2", "--engine", "ray",
         "--ray-address", cluster, "--max-error-rate", "0.1", "--json", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["n_in"], summary["n_written"], summary["n_rejected"]) == (62, 60, 2)
    assert (local.n_in, local.n_written, local.n_rejected) == (62, 60, 2)
    assert filecmp.cmp(out, tmp_path / "local.parquet", shallow=False)
    assert filecmp.cmp(
        tmp_path / "ray.errors.parquet", tmp_path / "local.errors.parquet", shallow=False
    )
    assert pq.read_table(out).column("sample_id").to_pylist() == [
        json.loads(line)["id"] for line in lines
    ]  # the defined order: the inputs'


def test_write_on_ray_equals_local(cluster, gen_inputs, tmp_path):
    _, cost, plan = gen_inputs
    cfg = dict(plan_dir=str(plan), cost_table=str(cost), shard_size=60_000)
    a = write_generation(WriteConfig(out=str(tmp_path / "local"), workers=2, **cfg))
    b = write_generation(WriteConfig(out=str(tmp_path / "ray"), engine="ray", workers=2, **cfg))
    assert a.generation == b.generation and a.shards == b.shards > 8
    _same_tree(tmp_path / "local", tmp_path / "ray")


def _kill_first_writer(stage_root: Path, killed: list, stop: threading.Event) -> None:
    """Once some stream has finished its second shard, SIGKILL a Ray worker process that is
    running a write task (its title is ``ray::equishard-write``)."""
    while not stop.is_set():
        if any(stage_root.glob(".staging-*/.parts/node-*/rank-*/shard-*-000001.json")):
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if cmd.startswith(b"ray::equishard-write"):
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
                    return
        time.sleep(0.001)


def test_write_task_killed_midway_is_retried(cluster, tmp_path):
    """A worker killed while writing a stream: Ray runs the task again, the stream resumes from
    its finished shards, and the generation is byte-identical to an undisturbed local run."""
    _, cost, plan = build_inputs(tmp_path, samples=240, seed=9)
    cfg = dict(plan_dir=str(plan), cost_table=str(cost), shard_size=4096)  # a shard per group
    write_generation(WriteConfig(out=str(tmp_path / "local"), **cfg))
    for attempt in range(3):  # the kill must land while a task runs; it nearly always does
        out = tmp_path / f"ray-{attempt}"
        killed: list[int] = []
        stop = threading.Event()
        watcher = threading.Thread(target=_kill_first_writer, args=(out, killed, stop))
        out.mkdir()
        watcher.start()
        try:
            write_generation(WriteConfig(out=str(out), engine="ray", workers=2, **cfg))
        finally:
            stop.set()
            watcher.join()
        if killed:
            break
    assert killed, "no write task was running when the watcher looked"
    _same_tree(tmp_path / "local", out)


def test_rebalance_on_ray_equals_local(cluster, root, tmp_path):
    """A night's rebalance (prep of the new day + write reusing kept groups) on Ray publishes
    the same generation as the same night run locally (at the same paths: they are in the cost
    table, so in the generation's id)."""
    pristine = tmp_path / "pristine"
    shutil.copytree(root.parent, pristine, symlinks=True)
    a = run_rebalance(_night(root, 2))
    shutil.copytree(root / a.generation, tmp_path / "local-result")
    shutil.rmtree(root.parent)
    shutil.copytree(pristine, root.parent, symlinks=True)
    b = run_rebalance(_night(root, 2, engine="ray", workers=2))
    assert a.status == b.status == "published"
    assert a.generation == b.generation and a.counts == b.counts
    assert b.counts["new"] > 0
    # the nightly plan's report records how long its phases took: the one field that differs
    for gen in (tmp_path / "local-result", root / b.generation):
        m = json.loads((gen / "manifest.json").read_text())
        assert m["report"].pop("seconds")
        (gen / "manifest.json").write_text(json.dumps(m))
    _same_tree(tmp_path / "local-result", root / b.generation)


def test_task_error_fails_the_run_and_rerun_resumes(cluster, tmp_path):
    """A sample whose image vanished: the write task's own WriteError reaches the driver as
    itself (not retried, it would fail again), nothing is published; once the image is back
    the re-run finishes the same generation a clean local run writes."""
    demo, cost, plan = build_inputs(tmp_path, samples=40, seed=3)
    cfg = dict(plan_dir=str(plan), cost_table=str(cost), shard_size=8192)
    ref = write_generation(WriteConfig(out=str(tmp_path / "local"), **cfg))
    image = sorted((demo / "images").iterdir())[-1]
    hidden = image.with_name("hidden")
    image.rename(hidden)
    out = tmp_path / "ray"
    with pytest.raises(WriteError, match="cannot be read any more"):
        write_generation(WriteConfig(out=str(out), engine="ray", workers=2, **cfg))
    assert not (out / "CURRENT").exists() and not list(out.glob("gen-*"))
    # the other tasks in flight ended before the error came back: nothing writes any more
    listing = lambda: sorted((str(f), f.stat().st_size) for f in out.rglob("*") if f.is_file())  # noqa: E731
    before = listing()
    time.sleep(1.5)
    assert listing() == before
    hidden.rename(image)
    res = write_generation(WriteConfig(out=str(out), engine="ray", workers=2, **cfg))
    assert res.generation == ref.generation
    _same_tree(tmp_path / "local", out)


def test_shards_the_driver_cannot_see_are_not_published(gen_inputs, tmp_path, monkeypatch):
    """A stream whose shards are not where the driver looks (a Ray node writing to its own
    disk instead of a shared file system): the driver refuses to publish, naming the cause."""
    import shards.write.writer as writer

    _, cost, plan = gen_inputs
    real = writer.StreamWriter

    class Lost(real):
        def submit(self, job):
            fut = super().submit(job)
            if job["rank"] == 2:
                (Path(job["stage"]) / fut.result()[0]["file"]).unlink()
            return fut

    monkeypatch.setattr(writer, "StreamWriter", Lost)
    out = tmp_path / "gens"
    cfg = WriteConfig(plan_dir=str(plan), cost_table=str(cost), out=str(out), shard_size=60_000)
    with pytest.raises(WriteError, match=r"rank 2: .* missing here.*every Ray node shares"):
        write_generation(cfg)
    assert not (out / "CURRENT").exists()
    monkeypatch.setattr(writer, "StreamWriter", real)
    assert write_generation(cfg).samples > 0  # the re-run rewrites the lost shard


def _freezes_once(marker_dir: str, x: int) -> int:
    """A task whose worker freezes (SIGSTOP: a hung mount, a stuck node) the first time it
    runs item 2, or every time for item 99."""
    marker = Path(marker_dir) / f"ran-{x}"
    if x == 99 or (x == 2 and not marker.exists()):
        marker.touch()
        os.kill(os.getpid(), signal.SIGSTOP)
    return x * x


def test_a_frozen_ray_worker_is_killed_and_its_task_retried(cluster, tmp_path):
    """Issue #37 item 8: a task that makes no progress for --task-timeout is killed and run
    again; the results are still every item's, in order (bug: ray.get waited forever)."""
    from equishard.common.ray_engine import RayOptions, ordered_map

    opts = RayOptions(address=cluster, task_timeout=4, max_retries=2)
    t0 = time.monotonic()
    got = list(ordered_map(_freezes_once, [(str(tmp_path), x) for x in range(5)], opts=opts,
                           inflight=2, star=True))  # fmt: skip
    assert got == [x * x for x in range(5)]
    assert time.monotonic() - t0 < 90


def test_a_task_stuck_every_time_fails_the_run_naming_it(cluster, tmp_path):
    from equishard.common.ray_engine import RayOptions, ordered_map

    opts = RayOptions(address=cluster, task_timeout=3, max_retries=1)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"made no progress for 3 s, 2 times \(item 99\)"):
        list(ordered_map(_freezes_once, [(str(tmp_path), 1), (str(tmp_path), 99)], opts=opts,
                         inflight=2, star=True))  # fmt: skip
    assert time.monotonic() - t0 < 90
