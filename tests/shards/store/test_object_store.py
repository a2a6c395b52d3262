"""Generations on an object store: a real S3 server (moto in server mode, HTTP on 127.0.0.1)
used through s3fs exactly as a bucket would be. Publishing order and resume, byte-range reads,
the local cache, integrity checks, exactly-once and resume of the loader, rebalance by URL."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shards.nightly.rebalance import run_rebalance
from shards.read.dataset import GroupDataset, RankInfo
from shards.read.reader import ShardError
from shards.read.verify import verify_generation
from shards.store.manifest import ManifestError, open_generation
from shards.store.object_store import publish_generation, read_remote_current
from shards.write.writer import WriteConfig, write_generation
from tests.shards.conftest import build_inputs
from tests.shards.conftest import s3_env as _env
from tests.shards.conftest import s3fs_of as _fs
from tests.shards.night_helpers import _night

s3fs = pytest.importorskip("s3fs")


def _publish(s3, gen_root: Path, url: str) -> str:
    gen = (gen_root / "CURRENT").read_text().strip()
    publish_generation(gen_root / gen, url, storage_options=s3["opts"])
    return gen


def _samples(ds) -> list:
    return [
        (b["step"], [(s.key, s.meta, s.images) for s in b["samples"]], b["skipped"]) for b in ds
    ]


def test_write_publishes_to_s3_in_order(s3, gen_inputs, bucket, tmp_path):
    """``write --out s3://...``: every object equals the local generation's file; the server
    receives the shards first, the manifest after all of them, CURRENT last of all."""
    _, cost, plan = gen_inputs
    log = s3["log"]
    before = len(log.lines)
    cfg = dict(plan_dir=str(plan), cost_table=str(cost), shard_size=60_000)
    res = write_generation(
        WriteConfig(out=bucket, staging=str(tmp_path / "stage"), storage_options=s3["opts"], **cfg)
    )
    order = [x.split('"PUT ')[1].split(" HTTP")[0] for x in log.lines[before:] if '"PUT ' in x]
    local = tmp_path / "stage" / res.generation
    assert res.path == f"{bucket}/{res.generation}"
    assert order[-1].endswith("/CURRENT") and order[-2].endswith(f"{res.generation}/manifest.json")
    assert len(order) == len(set(order))  # each object once
    assert sum(o.endswith(".tar") for o in order[:-2]) == res.shards
    fs = _fs(s3)
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert (
        sorted(
            k.split(f"{res.generation}/", 1)[1] for k in fs.find(f"{bucket[5:]}/{res.generation}")
        )
        == files
    )
    for f in files:
        assert fs.cat_file(f"{bucket[5:]}/{res.generation}/{f}") == (local / f).read_bytes(), f
    assert read_remote_current(bucket, storage_options=s3["opts"]) == res.generation


def test_interrupted_upload_is_invisible_then_resumes(s3, generation, bucket, monkeypatch):
    """An upload that dies half way leaves no manifest and no CURRENT: readers find nothing to
    read (a clear error, never a partial generation); the re-run uploads only what is missing."""
    gen = (generation / "CURRENT").read_text().strip()
    put_file = s3fs.S3FileSystem._put_file
    started, sent = [], []

    async def flaky(self, lpath, rpath, *a, **kw):
        started.append(rpath)
        if len(started) > 5:
            await asyncio.sleep(0.5)  # the first five finish, then the connection drops
            raise ConnectionError("connection reset by peer")
        out = await put_file(self, lpath, rpath, *a, **kw)
        sent.append(rpath)
        return out

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", flaky)
    with pytest.raises(ConnectionError):
        publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    with pytest.raises(ManifestError, match="neither a generation"):
        open_generation(bucket, storage_options=s3["opts"])
    with pytest.raises(ManifestError, match="no manifest"):
        open_generation(f"{bucket}/{gen}", storage_options=s3["opts"])
    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", put_file)
    stats = publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    assert stats["skipped"] == len(sent) > 0 and stats["uploaded"] > 1
    assert verify_generation(bucket, storage_options=s3["opts"]).ok


def test_loader_reads_groups_by_range_same_as_local(s3, generation, bucket, tmp_path):
    """Every rank's steps from S3 equal those from disk, sample for sample and byte for byte;
    each shard request is one group's range (206), never a whole shard; with a cache directory
    a second epoch makes no shard request at all."""
    gen = _publish(s3, generation, bucket)
    m = open_generation(generation)
    log = s3["log"]
    for rank in range(2):
        info = RankInfo(rank=rank, world_size=2)
        local = _samples(GroupDataset(generation, info, seed=3))
        before = len(log.lines)
        ds = GroupDataset(bucket, info, seed=3, storage_options=s3["opts"], cache_dir=tmp_path)
        assert _samples(ds) == local
        gets = [g for g in log.lines[before:] if '"GET ' in g and ".tar HTTP" in g]
        assert len(gets) == sum(1 for b in local if b[1]) and all('" 206' in g for g in gets)
        before = len(log.lines)
        ds.set_epoch(0)
        assert _samples(ds) == local  # from the cache
        assert not [g for g in log.lines[before:] if ".tar HTTP" in g]
    assert m.generation == gen


def test_verify_and_damage_on_s3(s3, generation, bucket, tmp_path):
    """The integrity checks of local disk hold on the store: a shard replaced by other bytes of
    the same size fails verify=True (naming the object), a shorter one fails the size check when
    the generation is opened, a damaged member header fails member validation."""
    gen = _publish(s3, generation, bucket)
    m = open_generation(generation)
    shard = m.streams[1].shards[0]
    key = f"{bucket[5:]}/{gen}/{shard.file}"
    fs = _fs(s3)
    data = bytearray(fs.cat_file(key))
    g = shard.groups[0]
    data[g.offset + 100] ^= 0xFF  # inside the first member's header (its name)
    fs.pipe_file(key, bytes(data))
    ds = GroupDataset(bucket, RankInfo(rank=1, world_size=4), shuffle=False, verify=True,
                      storage_options=s3["opts"], cache_dir=tmp_path)  # fmt: skip
    with pytest.raises(ShardError, match=f"s3://.*{shard.file}: sha256"):
        next(iter(ds))
    assert not list(tmp_path.glob("*.tar"))  # a shard that failed is not kept in the cache
    ds = GroupDataset(bucket, RankInfo(rank=1, world_size=4), shuffle=False,
                      storage_options=s3["opts"])  # fmt: skip
    with pytest.raises(ShardError, match=shard.file):
        next(iter(ds))
    res = verify_generation(bucket, storage_options=s3["opts"])
    assert not res.ok and shard.file in res.problems[0]
    fs.pipe_file(key, bytes(data[:-1024]))
    with pytest.raises(ManifestError, match="bytes on disk, manifest says"):
        open_generation(bucket, storage_options=s3["opts"])


def test_resume_is_exactly_once_on_s3(s3, generation, bucket):
    """Stopping after 3 steps and resuming from the state dict (another DP size, as elastic
    training does) delivers exactly the groups not yet delivered."""
    _publish(s3, generation, bucket)
    opts = s3["opts"]
    whole = [x for r in range(2) for x in _ids(GroupDataset(bucket, RankInfo(rank=r, world_size=2),
                                                           storage_options=opts))]  # fmt: skip
    first = []
    states = []
    for r in range(2):
        ds = GroupDataset(bucket, RankInfo(rank=r, world_size=2), storage_options=opts)
        it = iter(ds)
        first += [s for _ in range(3) for s in _ids_of(next(it))]
        states.append(ds.state_dict(3))
    from shards.read.dataset import merge_states

    state = merge_states(states)
    rest = []
    for r in range(3):
        ds = GroupDataset(bucket, RankInfo(rank=r, world_size=3), storage_options=opts)
        ds.load_state_dict(state)
        rest += _ids(ds)
    assert sorted(first + rest) == sorted(whole) and len(set(whole)) == len(whole)


def _ids_of(batch) -> list[str]:
    return [s.meta["sample_id"] for s in batch["samples"]]


def _ids(ds) -> list[str]:
    return [x for b in ds for x in _ids_of(b)]


def test_cli_write_verify_train_from_s3(s3, bucket, tmp_path):
    """The commands as users run them, credentials and endpoint from the environment: write to
    the bucket, verify, inspect and report it there, and train two steps reading it (2 gloo
    ranks). Its samples are prepped as ``make train``'s are (one 56-px tile an image), so that
    the steps take a second, not ten: the reads are what this test is about."""
    _, cost, plan = build_inputs(
        tmp_path / "in", samples=24, vision_policy="internvl:max_tiles=1,tile_size=56"
    )
    env = _env(s3)
    run = [sys.executable, "-m", "equishard"]
    w = subprocess.run(
        [*run, "write", str(plan), "--cost-table", str(cost), "--out", bucket, "--shard-size",
         "64KB", "--staging", str(tmp_path / "stage")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert w.returncode == 0, w.stderr
    assert "published" in w.stdout and bucket in w.stdout
    v = subprocess.run([*run, "verify", bucket], capture_output=True, text=True, env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    i = subprocess.run([*run, "inspect", bucket], capture_output=True, text=True, env=env)
    assert i.returncode == 0 and "gen-" in i.stdout, i.stderr
    html = tmp_path / "report.html"
    r = subprocess.run([*run, "report", bucket, "-o", str(html)], capture_output=True, text=True,
                       env=env)  # fmt: skip
    assert r.returncode == 0 and html.stat().st_size > 10_000, r.stderr
    from tests.dist_helper import free_port

    t = subprocess.run(
        [*run, "train", "--shards", bucket, "--shards-cache", str(tmp_path / "cache"), "--nproc",
         "2", "--dp", "2", "--steps", "2", "--log", str(tmp_path / "train.jsonl")],
        capture_output=True, text=True, timeout=600,
        env={**env, "MASTER_PORT": str(free_port())},
    )  # fmt: skip
    assert t.returncode == 0, t.stdout[-3000:] + t.stderr[-3000:]
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert any((tmp_path / "cache").rglob("*-*"))  # the ranks' groups came through the cache


def test_rebalance_by_url(s3, root, tmp_path):
    """A night's rebalance of a root on S3: its CURRENT is fetched (checked), rebalanced in the
    staging root, and the new generation published there with CURRENT moved; it is the same
    generation a local rebalance of the same root makes."""
    url = "s3://bkt/nightly-root"
    opts = s3["opts"]
    gen = _publish(s3, root, url)
    local_copy = tmp_path / "local"
    shutil.copytree(root.parent, local_copy, symlinks=True)
    stage = tmp_path / "stage"
    night = _night(root, 2)
    from dataclasses import replace

    res = run_rebalance(replace(night, current=url, staging=str(stage), storage_options=opts))
    assert res.status == "published" and res.parent == gen
    assert read_remote_current(url, storage_options=opts) == res.generation
    assert verify_generation(url, storage_options=opts).ok
    m = open_generation(url, storage_options=opts)
    assert m.parent == gen and m.totals["samples"] > open_generation(root).totals["samples"]
    again = run_rebalance(replace(night, current=url, staging=str(stage), storage_options=opts))
    assert again.status == "unchanged" and again.generation == res.generation
    here = run_rebalance(replace(night, current=str(local_copy / "shards")))
    assert here.generation == res.generation
