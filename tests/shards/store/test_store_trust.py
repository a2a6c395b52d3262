"""Nothing read from a manifest, a store listing or a cache chooses a local path or is trusted
for being there (issue #37, items 1, 2, 3, 5 and 8), against a real S3 server (moto) through
s3fs. Each test names the hole it closes; each failed before its fix."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import shards.store.object_store as store
from shards.errors import WriteError
from shards.nightly.rebalance import run_rebalance
from shards.read.dataset import GroupDataset, RankInfo
from shards.read.verify import verify_generation
from shards.store.manifest import ManifestError, load_manifest, open_generation
from shards.store.object_store import fetch_generation, publish_generation, read_remote_current
from shards.store.storage import GenerationFiles
from tests.shards.conftest import s3_env, s3fs_of
from tests.shards.night_helpers import _night

pytest.importorskip("s3fs")


def _publish(s3, gen_root: Path, url: str) -> str:
    gen = (gen_root / "CURRENT").read_text().strip()
    publish_generation(gen_root / gen, url, storage_options=s3["opts"])
    return gen


def _batches(ds) -> list:
    return [[(s.key, s.meta, s.images) for s in b["samples"]] for b in ds]


def _files_under(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*")}


# ------------------------------------------------------------------ 1: manifest fields
def _tamper(gen_dir: Path, edit) -> None:
    raw = json.loads((gen_dir / "manifest.json").read_text())
    edit(raw)
    (gen_dir / "manifest.json").write_text(json.dumps(raw))


def _shard0(raw: dict) -> dict:
    return raw["streams"][0]["shards"][0]


HOSTILE = {
    "sha256 a relative path": (lambda r: _shard0(r).update(sha256="../../pwned"), "sha256"),
    "sha256 an absolute path": (lambda r: _shard0(r).update(sha256="/tmp/pwned"), "sha256"),
    "sha256 upper case": (
        lambda r: _shard0(r).update(sha256=_shard0(r)["sha256"].upper()),
        "sha256",
    ),
    "sha256 one short": (lambda r: _shard0(r).update(sha256=_shard0(r)["sha256"][:-1]), "sha256"),
    "generation a path": (lambda r: r.update(generation="../gen-x"), "generation"),
    "parent a path": (lambda r: r.update(parent="../../etc"), "parent"),
    "parent hidden": (lambda r: r.update(parent=".staging-gen-1"), "parent"),
    "negative bytes": (lambda r: _shard0(r).update(bytes=-1), "negative"),
    "negative samples": (lambda r: _shard0(r).update(samples=-3), "negative"),
    "shard name with ./": (lambda r: _shard0(r).update(file="./" + _shard0(r)["file"]), "leaves"),
    "shard name with //": (
        lambda r: _shard0(r).update(file=_shard0(r)["file"].replace("/", "//", 1)),
        "leaves",
    ),
    "carried file a path": (
        lambda r: r["files"].update({"../../cost.parquet": r["files"]["cost.parquet"]}),
        "leaves",
    ),
    "loads negative": (lambda r: r["loads"].update(max_group_llm_tokens=-5), "loads"),
    "loads a string": (lambda r: r["loads"].update(max_group_llm_tokens="1e12"), "loads"),
    # a fetch or publish would write the carried entry's bytes over the real manifest
    "carried file the manifest": (
        lambda r: r["files"].update({"manifest.json": r["files"]["cost.parquet"]}),
        "manifest itself",
    ),
    "carried file the manifest, dotted": (
        lambda r: r["files"].update({"./manifest.json": r["files"]["cost.parquet"]}),
        "manifest itself|leaves",
    ),
    "carried file a shard": (
        lambda r: r["files"].update({_shard0(r)["file"]: r["files"]["cost.parquet"]}),
        "also named as shard",
    ),
    "carried file digest": (
        lambda r: r["files"]["cost.parquet"].update(sha256="../x"),
        "sha256",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_manifest_fields_that_name_paths_are_checked_at_load(gen_copy, case):
    """Every manifest field that becomes part of a path or a cache key is refused where the
    manifest is loaded (bug: a sha256 of ``../../X`` made the loader write and read cache
    files anywhere; a parent of ``../..`` sent retention up the tree)."""
    edit, match = HOSTILE[case]
    gen = gen_copy / (gen_copy / "CURRENT").read_text().strip()
    _tamper(gen, edit)
    with pytest.raises(ManifestError, match=match):
        load_manifest(gen)


def test_cache_never_builds_a_path_from_an_unchecked_digest(tmp_path):
    """Defence in depth below the manifest: the store refuses to name a cache file after a
    value that is not a digest, whoever calls it."""
    files = GenerationFiles("memory://trust/gen", cache_dir=tmp_path / "cache")
    files.fs.pipe_file(files.full_path("a.tar"), b"x" * 64)
    for bad in ("../../pwned", "/etc/passwd", "A" * 64):
        with pytest.raises(ValueError, match="not a sha256 digest"):
            files.read_range("a.tar", 0, 8, bad)
        with pytest.raises(ValueError, match="not a sha256 digest"):
            files.sha256("a.tar", expected=bad)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))


def test_tampered_digest_on_s3_writes_nothing_outside_the_cache(s3, generation, bucket, tmp_path):
    """The loader over S3 with a cache directory and a manifest whose sha256 is a path: the
    generation is refused at open, and nothing appears outside the cache directory."""
    gen = _publish(s3, generation, bucket)
    fs = s3fs_of(s3)
    key = f"{bucket[5:]}/{gen}/manifest.json"
    raw = json.loads(fs.cat_file(key))
    raw["streams"][0]["shards"][0]["sha256"] = "../../escaped"
    fs.pipe_file(key, json.dumps(raw).encode())
    cache = tmp_path / "a" / "b" / "cache"
    cache.mkdir(parents=True)
    before = _files_under(tmp_path)
    with pytest.raises(ManifestError, match="not a sha256 digest"):
        GroupDataset(bucket, RankInfo(rank=0, world_size=1), storage_options=s3["opts"],
                     cache_dir=cache, verify=True)  # fmt: skip
    assert _files_under(tmp_path) == before


# ------------------------------------------------------------------ 5: caches
def test_poisoned_whole_shard_cache_is_hashed_again_and_refetched(s3, generation, bucket, tmp_path):
    """``verify=True`` with a cache: a cached whole shard altered after it was kept (same size)
    is hashed again, dropped and fetched again; the samples delivered are the store's (bug:
    a cache hit returned the manifest's digest without reading the file)."""
    _publish(s3, generation, bucket)
    info = RankInfo(rank=0, world_size=2)
    opts = dict(storage_options=s3["opts"], cache_dir=tmp_path, verify=True, shuffle=False)
    want = _batches(GroupDataset(bucket, info, **opts))
    kept = sorted(tmp_path.glob("*.tar"))
    assert kept
    for path in kept:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x5A  # inside some member's bytes
        path.write_bytes(bytes(data))
    assert _batches(GroupDataset(bucket, info, **opts)) == want
    for path in kept:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.stem  # refetched


def test_damaged_range_cache_part_is_refetched(s3, generation, bucket, tmp_path):
    """A cached group range damaged on disk (a flipped byte, a truncation, a foreign file) is
    detected by its own checksum, dropped and read again from the store: the job goes on with
    the right bytes (bug: it failed naming the remote object, which was intact, or delivered
    the damaged bytes)."""
    _publish(s3, generation, bucket)
    info = RankInfo(rank=1, world_size=2)
    opts = dict(storage_options=s3["opts"], cache_dir=tmp_path, shuffle=False)
    want = _batches(GroupDataset(bucket, info, **opts))
    parts = sorted(p for p in tmp_path.rglob("*-*") if p.is_file())
    assert len(parts) >= 3
    damage = [
        lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:],
        lambda b: b[: len(b) // 2],
        lambda b: b"not a cached range at all",
    ]
    for k, path in enumerate(parts):
        path.write_bytes(damage[k % 3](path.read_bytes()))
    assert _batches(GroupDataset(bucket, info, **opts)) == want


def test_resumed_upload_replaces_a_damaged_leftover_of_the_right_size(s3, generation, bucket):
    """A resumed publish finds a shard object of the right size with other bytes (a damaged
    leftover): it is uploaded again, so the published generation verifies (bug: any object of
    the right size was skipped and published under a manifest it does not match)."""
    gen = (generation / "CURRENT").read_text().strip()
    m = load_manifest(generation / gen)
    shard = m.streams[0].shards[0]
    fs = s3fs_of(s3)
    key = f"{bucket[5:]}/{gen}/{shard.file}"
    good = (generation / gen / shard.file).read_bytes()
    fs.pipe_file(key, bytes(b ^ 0x01 for b in good))
    stats = publish_generation(generation / gen, bucket, storage_options=s3["opts"])
    assert fs.cat_file(key) == good
    assert stats["uploaded"] > 1
    assert verify_generation(bucket, storage_options=s3["opts"]).ok


# ------------------------------------------------------------------ 2: fetch by the manifest
def test_fetch_takes_only_what_the_manifest_names(s3, generation, bucket, tmp_path):
    """Keys under a generation's prefix that the manifest does not name (one with ``..``
    segments, stray objects) are never fetched, so a key cannot choose a local path; the local
    copy holds exactly the manifest's shards and carried files (bug: every key was downloaded
    to ``staging / key``)."""
    gen = _publish(s3, generation, bucket)
    fs = s3fs_of(s3)
    prefix = f"{bucket[5:]}/{gen}"
    fs.pipe_file(f"{prefix}/stray.bin", b"not part of the generation")
    hostile = f"{prefix}/../../../../escaped-by-key"
    with contextlib.suppress(OSError, ValueError):  # a store may refuse such a key: safe too
        fs.pipe_file(hostile, b"x")
    staging = tmp_path / "w" / "staging"
    before = _files_under(tmp_path)
    dest = fetch_generation(bucket, gen, staging, storage_options=s3["opts"])
    m = load_manifest(dest)
    named = {sh.file for st in m.streams for sh in st.shards} | set(m.carried)
    got = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert got == named | {"manifest.json"}
    outside = _files_under(tmp_path) - before
    assert all(p == "w" or p.startswith("w/staging") for p in outside), outside


def test_damaged_staging_copy_is_dropped_and_fetched_again(s3, generation, bucket, tmp_path):
    """A local staging copy of the store's CURRENT damaged after it was fetched (a shard with
    other bytes of the same size) is checked by checksum, dropped and fetched again (bug: it
    was kept for its manifest and failed every later night until deleted by hand)."""
    gen = _publish(s3, generation, bucket)
    staging = tmp_path / "staging"
    dest = fetch_generation(bucket, gen, staging, storage_options=s3["opts"])
    shard = load_manifest(dest).streams[0].shards[0]
    good = (dest / shard.file).read_bytes()
    (dest / shard.file).write_bytes(bytes(b ^ 0x01 for b in good))
    dest = fetch_generation(bucket, gen, staging, storage_options=s3["opts"])
    assert (dest / shard.file).read_bytes() == good
    assert verify_generation(dest).ok


def test_fetch_copies_each_object_only_to_its_listed_size(
    s3, generation, bucket, tmp_path, monkeypatch
):
    """An object replaced by a larger one after the store listed it (another job writing the
    prefix, a listing gone stale) was downloaded whole by fsspec's ``get`` before its checksum
    failed: a store that streams without end filled the disk. Each copy now stops one byte
    past its listed size and the fetch fails naming the object, its size and the damage."""
    gen = _publish(s3, generation, bucket)
    shard = load_manifest(generation / gen).streams[0].shards[0]
    key = f"{bucket[5:]}/{gen}/{shard.file}"
    fs = s3fs_of(s3)
    sizes, first = GenerationFiles.sizes, []

    def stale_listing(self, files):  # the object grows right after the first listing
        if not first:
            first.append(sizes(self, files))
            fs.pipe_file(key, b"\0" * (shard.bytes + (4 << 20)))
            self.fs.invalidate_cache()  # what is fetched is the object as it is now
        return first[0]

    monkeypatch.setattr(GenerationFiles, "sizes", stale_listing)
    staging = tmp_path / "staging"
    with pytest.raises(WriteError, match=f"{shard.file}: more than the {shard.bytes} bytes"):
        fetch_generation(bucket, gen, staging, storage_options=s3["opts"])
    assert not (staging / gen).exists()
    copies = [p for p in staging.rglob("*.tar") if p.name == Path(shard.file).name]
    assert copies and all(p.stat().st_size <= shard.bytes + 1 for p in copies)


# ------------------------------------------------------------------ 3: concurrent nights
def _on_chain(url: str, opts: dict, generation: str) -> bool:
    g = read_remote_current(url, storage_options=opts)
    while g:
        if g == generation:
            return True
        g = open_generation(f"{url}/{g}", storage_options=opts).parent
    return False


def test_two_nights_on_one_store_root_exactly_one_publishes(s3, root, tmp_path, monkeypatch):
    """Night A reads CURRENT, then night B (another machine: its own staging) publishes from
    the same parent before A is done: A's publish is refused with a clear message and CURRENT
    stays on B; run again, A rebases onto B and both nights' samples are on the chain (bug:
    both exited ``published`` and one night's samples were silently off the chain)."""
    url, opts = "s3://bkt/concurrent-nights", s3["opts"]
    parent = _publish(s3, root, url)
    night_a = replace(_night(root, 2), current=url, staging=str(tmp_path / "a"),
                      storage_options=opts)  # fmt: skip
    night_b = replace(_night(root, 3), current=url, staging=str(tmp_path / "b"),
                      storage_options=opts)  # fmt: skip
    fetch = store.fetch_generation
    done = {}

    def b_runs_meanwhile(*args, **kw):
        if not done:
            done["b"] = None
            done["b"] = run_rebalance(night_b)  # B, start to end, while A is under way
        return fetch(*args, **kw)

    monkeypatch.setattr(store, "fetch_generation", b_runs_meanwhile)
    with pytest.raises(store.ConcurrentPublishError, match="another writer moved CURRENT"):
        run_rebalance(night_a)
    b = done["b"]
    assert b.status == "published" and b.parent == parent
    assert read_remote_current(url, storage_options=opts) == b.generation
    monkeypatch.setattr(store, "fetch_generation", fetch)
    a = run_rebalance(night_a)  # the same night again: rebases onto B
    assert a.status == "published" and a.parent == b.generation
    assert _on_chain(url, opts, b.generation) and _on_chain(url, opts, a.generation)
    assert verify_generation(url, storage_options=opts).ok


def test_two_night_processes_never_lose_a_night(s3, root, tmp_path):
    """Two ``equishard rebalance`` processes (their own staging roots) on one store root at
    the same time: every night that reports ``published`` is on the CURRENT chain; one that
    lost the race fails (exit 1) naming the other's generation."""
    url = "s3://bkt/two-processes"
    _publish(s3, root, url)
    raw = root.parent / "raw"
    procs = []
    for k, day in ((0, 2), (1, 3)):
        cmd = [sys.executable, "-m", "equishard", "rebalance", "--current", url, "--new",
               str(raw / f"day-{day}.jsonl"), "--delete", str(raw / f"day-{day}.delete"),
               "--staging", str(tmp_path / f"s{k}"), "--json"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=s3_env(s3)))  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    published = []
    for p, (out, err) in zip(procs, outs, strict=True):
        if p.returncode == 0:
            published.append(json.loads(out)["generation"])
        else:
            assert p.returncode == 1 and "another writer moved CURRENT" in err, err[-2000:]
    assert published
    for g in published:
        assert _on_chain(url, s3["opts"], g)


# ------------------------------------------------------------------ 8: bounded waits
@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_an_endpoint_that_never_answers_fails_within_the_store_timeout(tmp_path, scheme):
    """A store endpoint that accepts connections and never answers: ``verify`` fails after
    about ``--store-timeout x --store-retries`` seconds, naming the URL (bug: botocore's
    defaults times s3fs's retries took ~410 s per request, with no way to set them)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])  # kept open, never answered
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**s3_env({"endpoint": endpoint})}
    url = "s3://bkt/silent" if scheme == "s3" else f"{endpoint}/silent"
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "equishard", "verify", url,
             "--store-timeout", "1", "--store-retries", "2"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        sock.close()
    took = time.monotonic() - t0
    assert r.returncode != 0 and url in r.stdout + r.stderr, r.stderr[-2000:]
    assert took < 60, took


def test_store_limits_refuse_nonsense(monkeypatch):
    from shards.store.storage import bounded_options

    # a typo's limits (retries by the thousand, a timeout of days or none) would hold a job
    # for days against an endpoint that never answers: refused, the largest taken
    for timeout, retries in (("0", "3"), ("inf", "3"), ("3600.5", "3"), ("5", "0"), ("5", "101")):
        monkeypatch.setenv("EQUISHARD_STORE_TIMEOUT", timeout)
        monkeypatch.setenv("EQUISHARD_STORE_RETRIES", retries)
        with pytest.raises(ValueError, match="EQUISHARD_STORE_TIMEOUT"):
            bounded_options("s3://b/x", {})
    monkeypatch.setenv("EQUISHARD_STORE_TIMEOUT", "3600")
    monkeypatch.setenv("EQUISHARD_STORE_RETRIES", "100")
    assert bounded_options("s3://b/x", {})[1] == 100
    monkeypatch.setenv("EQUISHARD_STORE_TIMEOUT", "5")
    monkeypatch.setenv("EQUISHARD_STORE_RETRIES", "2")
    opts, retries = bounded_options("s3://b/x", {"config_kwargs": {"read_timeout": 9}})
    assert retries == 2
    assert opts["config_kwargs"] == {
        "connect_timeout": 5.0,
        "read_timeout": 9,
        "retries": {"max_attempts": 1, "mode": "standard"},
    }
    assert bounded_options("gs://b/x", {"a": 1}) == ({"a": 1}, None)
    http, _ = bounded_options("https://host/gen", {})
    assert http["client_kwargs"]["timeout"].sock_read == 5.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--store-retries", "101"], "--store-retries must be a whole number in 1..100"),
        (["--store-retries", "0"], "--store-retries must be a whole number in 1..100"),
        (["--store-timeout", "inf"], r"--store-timeout must be seconds in \(0, 3600\]"),
        (["--store-timeout", "86400"], r"--store-timeout must be seconds in \(0, 3600\]"),
    ],
)
def test_store_flags_out_of_range_are_refused_before_any_request(
    flags, message, monkeypatch, capsys
):
    """The flags' twin of the environment's limits: a request tried 30,000 times, or waiting
    a day, is a typo that would hold a job for days against a dead endpoint."""
    from equishard.cli import main

    monkeypatch.setenv("EQUISHARD_STORE_TIMEOUT", "30")  # restored after the test
    monkeypatch.setenv("EQUISHARD_STORE_RETRIES", "3")
    assert main(["verify", "s3://never-contacted/gen", *flags]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_huge_step_count_is_refused_without_building_it(gen_copy):
    """``layout.steps`` comes from the manifest: a value of 10^15 is refused at once (bug: the
    check built a list of that many steps and never returned)."""
    gen = gen_copy / (gen_copy / "CURRENT").read_text().strip()
    _tamper(gen, lambda r: r["layout"].update(steps=10**15))
    t0 = time.monotonic()
    with pytest.raises(ManifestError, match="no group for step"):
        load_manifest(gen)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("bad", [None, -5, "12", 3.0, True])
def test_sizes_a_store_reports_are_checked_where_they_enter(bad, monkeypatch):
    """A listing's or a single object's size is a whole number of bytes: a missing, negative or
    textual one (a proxy, a store in a bad state) was a TypeError deep in a comparison, or a
    negative size compared as a shard's; now a ValueError naming the object."""
    import fsspec

    from shards.store.storage import GenerationFiles

    fs = fsspec.filesystem("memory")
    fs.pipe("/gen-x/manifest.json", b"{}")
    files = GenerationFiles("memory://gen-x")
    assert files.sizes(1) == {"manifest.json": 2} and files.size("manifest.json") == 2
    real_find = files.fs.find

    def find(path, detail=False, **kw):
        found = real_find(path, detail=True, **kw)
        return {k: {**v, "size": bad} for k, v in found.items()}

    monkeypatch.setattr(files.fs, "find", find)
    with pytest.raises(ValueError, match="reports a size of"):
        files.sizes(1)
    monkeypatch.setattr(files.fs, "size", lambda path: bad)
    if bad is None:  # one object's size may be unknown (plain HTTP): read to the limit
        assert files.size("manifest.json") is None
        assert files.read_bytes("manifest.json", 4096) == b"{}"
    else:
        with pytest.raises(ValueError, match="reports a size of"):
            files.size("manifest.json")
