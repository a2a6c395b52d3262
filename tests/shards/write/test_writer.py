"""The writer: deterministic bytes, idempotence, crash safety under SIGKILL, stale staging."""

from __future__ import annotations

import filecmp
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shards.read.dataset import open_generation
from shards.store.manifest import ManifestError
from shards.store.publish import read_current
from shards.write.writer import WriteConfig, WriteError, write_generation


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_byte_identical_and_idempotent(gen_inputs, generation, tmp_path):
    _, cost, plan = gen_inputs
    cfg = WriteConfig(
        plan_dir=str(plan), cost_table=str(cost), out=str(tmp_path / "again"), shard_size=200_000
    )
    r = write_generation(cfg)
    assert _files(tmp_path / "again") == _files(generation)
    m = open_generation(generation)
    assert sum(len(st.shards) for st in m.streams) > m.dp  # several shards per stream
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "again").rglob("*.tar")}
    again = write_generation(cfg)
    assert again.reused and again.generation == r.generation
    assert stamp == {p: p.stat().st_mtime_ns for p in (tmp_path / "again").rglob("*.tar")}


@pytest.mark.parametrize("cores", [None, "8"])
def test_parallel_writer_processes_write_the_same_bytes(
    gen_inputs, generation, tmp_path, monkeypatch, cores
):
    """--workers 3: on 2 cores one process; seen as 8 cores, two spawned workers besides this
    process, each writing its streams through its own StreamWriter."""
    _, cost, plan = gen_inputs
    if cores:
        monkeypatch.setenv("EQUISHARD_CORES", cores)
    cfg = WriteConfig(
        plan_dir=str(plan),
        cost_table=str(cost),
        out=str(tmp_path / "w2"),
        shard_size=200_000,
        workers=3,
    )
    write_generation(cfg)
    assert _files(tmp_path / "w2") == _files(generation)


def test_manifest_contents(generation, gen_inputs):
    m = open_generation(generation)
    raw = m.raw
    assert (
        raw["format_version"] == 1 and raw["generation"] == m.generation and raw["parent"] is None
    )
    plan_rows = json.loads((gen_inputs[2] / "report.json").read_text())["counts"]["out"]
    assert m.totals["samples"] == plan_rows
    for st in m.streams:
        assert st.rank == st.node * m.gpus_per_node + st.local_rank
        steps = [g.step for sh in st.shards for g in sh.groups]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
        for sh in st.shards:
            assert sh.file.startswith(f"node-{st.node:03d}/rank-{st.local_rank:03d}/")
            assert (
                len(sh.sha256) == 64
                and sh.bytes == (generation / m.generation / sh.file).stat().st_size
            )


_KILL_SCRIPT = """
import sys
from shards.write.writer import WriteConfig, write_generation
cfg = WriteConfig(plan_dir=sys.argv[1], cost_table=sys.argv[2], out=sys.argv[3], shard_size=60_000)
write_generation(cfg)
"""


def test_sigkill_at_random_points_leaves_previous_generation_and_resumes_identically(
    gen_inputs, tmp_path
):
    from tests.shards.conftest import build_inputs

    _, cost, plan = gen_inputs
    _, _, plan_b = build_inputs(gen_inputs[0].parent, plan_seed=1)
    root = tmp_path / "root"
    old = write_generation(
        WriteConfig(plan_dir=str(plan), cost_table=str(cost), out=str(root), shard_size=60_000)
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    args = [sys.executable, "-c", _KILL_SCRIPT, str(plan_b), str(cost), str(root)]
    t0 = time.perf_counter()
    subprocess.run(args, env=env, check=True, cwd=tmp_path)
    clean_seconds = time.perf_counter() - t0
    clean = _files(root / read_current(root))
    new_id = read_current(root)
    # start over from the old generation and kill the writer at random moments
    import shutil

    shutil.rmtree(root / new_id)
    (root / "CURRENT").write_text(old.generation + "\n")
    rng = random.Random(7)
    for _ in range(6):
        proc = subprocess.Popen(args, env=env, cwd=tmp_path)
        time.sleep(rng.uniform(0.2, clean_seconds))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        m = open_generation(root)  # readers always see a complete generation
        assert m.generation in (old.generation, new_id)
        assert m.totals["samples"] == sum(st.samples for st in m.streams)
    subprocess.run(args, env=env, check=True, cwd=tmp_path)
    assert read_current(root) == new_id
    assert _files(root / new_id) == clean
    assert not list(root.glob(".staging-*"))
    assert open_generation(root).parent == old.generation


def test_stale_staging_is_removed_and_a_live_writer_is_refused(gen_inputs, tmp_path):
    import fcntl

    _, cost, plan = gen_inputs
    root = tmp_path / "root"
    (root / ".staging-gen-deadbeef" / "node-000").mkdir(parents=True)
    (root / ".staging-gen-deadbeef" / ".lock").write_text("")
    cfg = WriteConfig(plan_dir=str(plan), cost_table=str(cost), out=str(root), shard_size=200_000)
    r = write_generation(cfg)
    assert not (root / ".staging-gen-deadbeef").exists()
    # a second writer of the same generation while one holds its lock is refused
    import shutil

    shutil.rmtree(root / r.generation)
    (root / f".staging-{r.generation}").mkdir()
    with open(root / f".staging-{r.generation}" / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(WriteError, match="another writer"):
            write_generation(cfg)


def test_no_generation_is_a_clear_error(tmp_path):
    with pytest.raises(ManifestError, match="CURRENT"):
        open_generation(tmp_path)


def test_missing_input_sample_fails_naming_it(gen_inputs, tmp_path):
    import shutil

    demo, cost, _plan = gen_inputs
    private = tmp_path / "inputs"
    shutil.copytree(demo, private / "demo")
    from tests.shards.conftest import build_inputs

    _, cost2, plan2 = build_inputs(private)
    for img in (private / "demo" / "images").iterdir():
        img.unlink()
    with pytest.raises(WriteError, match="cannot be read any more"):
        write_generation(
            WriteConfig(plan_dir=str(plan2), cost_table=str(cost2), out=str(tmp_path / "o"))
        )
    assert filecmp.cmp(cost, cost, shallow=False)


def test_a_failed_write_renames_nothing_and_a_rerun_finishes_identically(
    gen_inputs, generation, tmp_path, monkeypatch
):
    """A disk error in the writer thread (here: ENOSPC on the third shard's bytes) fails the
    write; that shard is never published under its final name, and the next run completes."""
    import shards.write.stream_writer as sw
    from tests.shards.full_disk import FullDisk

    _, cost, plan = gen_inputs
    cfg = WriteConfig(
        plan_dir=str(plan), cost_table=str(cost), out=str(tmp_path / "g"), shard_size=200_000
    )
    opened = []

    real_init = sw._ShardFile.__init__

    def init(self, path, *args):
        real_init(self, path, *args)
        opened.append(path)
        if len(opened) == 3:
            self.f = FullDisk(self.f)

    monkeypatch.setattr(sw._ShardFile, "__init__", init)
    with pytest.raises(OSError, match="No space left"):
        write_generation(cfg)
    bad = opened[2]
    assert not bad.with_suffix("").exists()  # shard-NNNNNN.tar was never renamed into place
    assert not (tmp_path / "g" / "CURRENT").exists()
    monkeypatch.setattr(sw._ShardFile, "__init__", real_init)
    write_generation(cfg)
    assert _files(tmp_path / "g") == _files(generation)


def test_each_job_carries_only_its_own_rows(gen_inputs, tmp_path):
    """Jobs go to worker processes pickled: each holds its rank's rows, not the whole plan."""
    import pickle

    import pyarrow as pa

    from dataprep import read_cost_table
    from shards.write.plan_input import read_plan
    from shards.write.write_jobs import stream_jobs

    _, cost, plan_dir = gen_inputs
    table = read_cost_table(cost)
    plan, _, nodes, per, where = read_plan(plan_dir, table, str(cost))
    cfg = WriteConfig(plan_dir=str(plan_dir), cost_table=str(cost), out=str(tmp_path / "o"))
    jobs = stream_jobs(plan, table, where, tmp_path, cfg, {}, nodes, per)
    assert sum(j["rows"].num_rows for j in jobs) == plan.num_rows
    for j in jobs:
        assert set(j["rows"].column("sample_id").to_pylist()) == set(
            plan.filter(plan.column("rank").to_numpy() == j["rank"]).column("sample_id").to_pylist()
        )
    whole = len(pickle.dumps(pa.concat_tables([j["rows"] for j in jobs]).combine_chunks()))
    # a job holding a slice of one big table would pickle all of its buffers: 4x the whole
    assert sum(len(pickle.dumps(j["rows"])) for j in jobs) < 1.5 * whole


def test_a_half_done_atomic_write_of_a_killed_run_is_not_published(
    gen_inputs, generation, tmp_path, monkeypatch
):
    """A run killed inside an atomic write leaves its ``.NAME.tmp-PID`` in the staging
    directory; the run that finishes the generation does not publish it."""
    import shards.write.writer as w

    _, cost, plan = gen_inputs
    cfg = WriteConfig(
        plan_dir=str(plan), cost_table=str(cost), out=str(tmp_path / "g"), shard_size=200_000
    )
    real = w.atomic_write_bytes

    def killed(path, data):
        path = Path(path)
        (path.parent / f".{path.name}.tmp-99999").write_bytes(data[: len(data) // 2])
        raise SystemExit("killed")  # what SIGKILL leaves behind: the partial temporary file

    monkeypatch.setattr(w, "atomic_write_bytes", killed)
    with pytest.raises(SystemExit):
        write_generation(cfg)
    assert list((tmp_path / "g").glob(".staging-*/.*.tmp-99999"))
    monkeypatch.setattr(w, "atomic_write_bytes", real)
    write_generation(cfg)
    assert _files(tmp_path / "g") == _files(generation)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def _edit_sidecar(path: Path, edit) -> None:
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def _killed_write(gen_inputs, tmp_path, monkeypatch, at: str):
    """(config, staging directory) of a write killed when it calls ``shards.write.writer.<at>``
    (``atomic_write_bytes``: before the manifest; ``write_wids_index``: right after it)."""
    import shards.write.writer as w

    _, cost, plan = gen_inputs
    cfg = WriteConfig(
        plan_dir=str(plan), cost_table=str(cost), out=str(tmp_path / "g"), shard_size=200_000
    )

    def killed(*args):
        raise SystemExit(f"killed at {at}")

    monkeypatch.setattr(w, at, killed)
    with pytest.raises(SystemExit):
        write_generation(cfg)
    monkeypatch.undo()
    (stage,) = (tmp_path / "g").glob(".staging-*")
    return cfg, stage


LEFTOVER_DAMAGE = {
    # a finished shard changed at rest after its sidecar was written (same size)
    "shard bytes": lambda tar, side: _flip_byte(tar),
    "sidecar not JSON": lambda tar, side: side.write_text('{"file": '),
    "sidecar size a float": lambda tar, side: _edit_sidecar(
        side, lambda m: m.update(bytes=float(m["bytes"]))
    ),
    # groups that are not the plan's next ones: the resume would skip planned steps
    "sidecar steps": lambda tar, side: _edit_sidecar(
        side, lambda m: [g.__setitem__(0, g[0] + 1) for g in m["groups"]]
    ),
    "sidecar names another file": lambda tar, side: _edit_sidecar(
        side, lambda m: m.update(file="../../outside.tar")
    ),
    "sidecar a FIFO": lambda tar, side: (side.unlink(), os.mkfifo(side)),
    "sidecar sha256 a path": lambda tar, side: _edit_sidecar(
        side, lambda m: m.update(sha256="../../" + "a" * 58)
    ),
    # group entries that are not [step, samples, offset, length] of whole numbers, byte ranges
    # that hold nothing, or groups past the plan's: each would go into the manifest as read
    "sidecar group of five values": lambda tar, side: _edit_sidecar(
        side, lambda m: m["groups"][0].append(7)
    ),
    "sidecar offset false": lambda tar, side: _edit_sidecar(
        side, lambda m: m["groups"][0].__setitem__(2, False)
    ),
    "sidecar group of length 0": lambda tar, side: _edit_sidecar(
        side, lambda m: m["groups"][-1].__setitem__(3, 0)
    ),
    "sidecar group past the plan": lambda tar, side: _edit_sidecar(
        side, lambda m: m["groups"].extend([list(m["groups"][-1])] * 50)
    ),
}


@pytest.mark.parametrize("damage", LEFTOVER_DAMAGE, ids=list(LEFTOVER_DAMAGE))
def test_a_resumed_write_rewrites_leftovers_that_do_not_check_out(
    gen_inputs, generation, tmp_path, monkeypatch, damage
):
    """The staging directory a killed run leaves is read back by the next run: a finished
    shard is kept only when its sidecar parses, names it, lists the plan's next groups, and the
    file has the sidecar's size and sha256. Whatever was damaged, the finished generation is
    byte-identical to an uninterrupted run's (bug: a shard of the right size was kept, so a
    changed byte went into a manifest that vouched for it; a broken sidecar crashed every
    later run; a sidecar with other steps made the resume skip planned groups)."""
    cfg, stage = _killed_write(gen_inputs, tmp_path, monkeypatch, "atomic_write_bytes")
    tars = sorted(stage.glob("node-*/rank-*/shard-*-000000.tar"))
    assert tars
    for tar in tars[:2]:
        side = stage / ".parts" / tar.relative_to(stage).with_suffix(".json")
        assert side.is_file()
        LEFTOVER_DAMAGE[damage](tar, side)
    write_generation(cfg)
    assert _files(tmp_path / "g") == _files(generation)


def test_a_resumed_write_rewrites_a_last_shard_whose_sidecar_lists_more_than_the_plan(
    gen_inputs, generation, tmp_path, monkeypatch
):
    """The last shard of a stream whose sidecar lists one group past the plan's end: rewritten
    (bug: the check read the plan past its end, an index error for every later run)."""
    cfg, stage = _killed_write(gen_inputs, tmp_path, monkeypatch, "atomic_write_bytes")
    stream = sorted(stage.glob("node-*/rank-*"))[0]
    last = sorted(stream.glob("shard-*.tar"))[-1]
    side = stage / ".parts" / last.relative_to(stage).with_suffix(".json")
    _edit_sidecar(side, lambda m: m["groups"].append([m["groups"][-1][0] + 1, 1, 0, 1]))
    write_generation(cfg)
    assert _files(tmp_path / "g") == _files(generation)


STAGED_DAMAGE = {
    "a shard's bytes": lambda stage: _flip_byte(sorted(stage.glob("node-*/rank-*/*.tar"))[0]),
    "the carried cost table": lambda stage: _flip_byte(stage / "cost.parquet"),
    "the manifest not JSON": lambda stage: (stage / "manifest.json").write_text('{"format'),
    "the manifest another generation's": lambda stage: _edit_sidecar(
        stage / "manifest.json", lambda m: m.update(generation="gen-0123456789abcdef")
    ),
}


@pytest.mark.parametrize("damage", STAGED_DAMAGE, ids=list(STAGED_DAMAGE))
def test_a_run_killed_after_its_manifest_publishes_only_checked_files(
    gen_inputs, generation, tmp_path, monkeypatch, damage
):
    """A run killed after writing the staged manifest, before the rename that publishes it:
    the next run published the staged directory as it found it (bug: a shard or carried file
    changed since, or a manifest that is not this generation's, went out under CURRENT). Now
    the staged manifest is kept only when it is this generation's and every file it names
    matches its sha256; otherwise the generation is written again, byte-identical to a clean
    run's."""
    cfg, stage = _killed_write(gen_inputs, tmp_path, monkeypatch, "write_wids_index")
    assert (stage / "manifest.json").is_file()
    STAGED_DAMAGE[damage](stage)
    write_generation(cfg)
    assert _files(tmp_path / "g") == _files(generation)


def test_a_generation_with_shards_larger_than_a_tib_loads(gen_inputs, tmp_path):
    """--shard-size 2TB (one shard per stream) writes a manifest whose shard_size its own
    loader refused (the manifest check capped it at 2^40 bytes)."""
    from shards import open_generation

    _, cost, plan = gen_inputs
    root = tmp_path / "g"
    write_generation(
        WriteConfig(plan_dir=str(plan), cost_table=str(cost), out=str(root), shard_size=2 << 40)
    )
    m = open_generation(root)
    assert m.raw["shard_size"] == 2 << 40 and all(len(st.shards) == 1 for st in m.streams)
