"""CURRENT moves forward only, unless asked (shards/store/current_guard.py): re-running the day's
``equishard write`` after a night had published printed "already complete", exited 0 and moved
CURRENT back to the old generation, so every loader silently lost the night's samples."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from equishard.common import file_lock
from shards.errors import WriteError
from shards.nightly.rebalance import run_rebalance
from shards.store import current_guard
from shards.store.current_guard import descends_from
from shards.store.manifest import MANIFEST, open_generation
from shards.store.publish import read_current, set_current
from shards.write.writer import WriteConfig, write_generation
from tests.shards.night_helpers import _night


def _day1(root: Path, **kw) -> WriteConfig:
    """The day-1 write that made the root's first generation (tests/shards/night_helpers.py)."""
    kw.setdefault("shard_size", 1 << 20)
    return WriteConfig(
        plan_dir=str(root.parent / "plan"),
        cost_table=str(root.parent / "cost.parquet"),
        out=str(root),
        **kw,
    )


def test_write_after_a_night_is_refused_and_current_stays(root):
    day1 = read_current(root)
    night = run_rebalance(_night(root, 2)).generation
    with pytest.raises(WriteError) as e:
        write_generation(_day1(root))
    msg = str(e.value)
    assert f"CURRENT names {night}" in msg and day1 in msg and "--force" in msg
    assert "\n" not in msg and str(root) in msg
    assert read_current(root) == night  # nothing moved
    # on purpose: the rollback is made and said
    r = write_generation(_day1(root, force=True))
    assert r.reused and read_current(root) == day1
    # forward again: the night descends from day 1, so writing it back needs no --force
    assert descends_from(root, open_generation(root / night).parent, day1)


def test_rewriting_the_current_generation_or_a_root_without_current_moves_nothing_back(root):
    day1 = read_current(root)
    assert write_generation(_day1(root)).reused and read_current(root) == day1
    (root / "CURRENT").unlink()
    assert write_generation(_day1(root)).reused and read_current(root) == day1


def test_a_descendant_of_current_is_made_current_without_force(root):
    """A generation written after day 1 (its parent), then a rollback to day 1 on purpose:
    writing the later one again is forward, so it needs no --force."""
    day1 = read_current(root)
    later = write_generation(_day1(root, shard_size=1 << 19))
    assert later.parent == day1 and read_current(root) == later.generation
    set_current(root, day1)  # the explicit rollback
    again = write_generation(_day1(root, shard_size=1 << 19))
    assert again.reused and read_current(root) == later.generation


def test_current_moved_while_writing_is_refused_and_a_rerun_publishes_after_it(root, monkeypatch):
    """A fresh write whose CURRENT another writer moved meanwhile: publishing it would skip
    theirs. Refused, CURRENT left where they put it; a re-run records the new parent."""
    import shards.write.writer as w

    day1 = read_current(root)
    real = w._write_all

    def racing(cfg, stage, gen, parent, *a, **k):
        real(cfg, stage, gen, parent, *a, **k)
        set_current(root, "gen-someone-else")  # a night published meanwhile

    monkeypatch.setattr(w, "_write_all", racing)
    cfg = _day1(root, shard_size=1 << 19)  # another generation of the same plan
    with pytest.raises(WriteError, match=rf"moved from {day1} to gen-someone-else"):
        write_generation(cfg)
    assert read_current(root) == "gen-someone-else"
    monkeypatch.setattr(w, "_write_all", real)
    r = write_generation(cfg)
    assert read_current(root) == r.generation and r.parent == "gen-someone-else"
    assert open_generation(root / r.generation).parent == "gen-someone-else"


def test_cli_refusal_is_one_line_exit_2_and_force_rolls_back(root):
    day1 = read_current(root)
    night = run_rebalance(_night(root, 2)).generation
    cmd = [sys.executable, "-m", "equishard", "write", str(root.parent / "plan")]
    cmd += ["--cost-table", str(root.parent / "cost.parquet"), "--out", str(root)]
    cmd += ["--shard-size", "1MB"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 2, p.stderr  # refused as asked, like a bad argument
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"CURRENT names {night}" in lines[0] and "--force" in lines[0]
    assert "already complete" not in p.stdout and read_current(root) == night
    p = subprocess.run([*cmd, "--force"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert read_current(root) == day1


def test_descends_from_walks_the_chain_and_stops(monkeypatch):
    chain = {"c": "b", "b": "a", "a": None, "x": "y", "y": "x"}
    monkeypatch.setattr(current_guard, "_parent_of", lambda root, g: chain.get(g))
    assert descends_from(Path("."), "c", "a") and descends_from(Path("."), "c", "c")
    assert not descends_from(Path("."), "c", "z") and not descends_from(Path("."), None, "a")
    assert not descends_from(Path("."), "x", "z")  # a cycle ends the walk
    long = {f"g{i}": f"g{i + 1}" for i in range(current_guard.MAX_CHAIN + 5)}
    monkeypatch.setattr(current_guard, "_parent_of", lambda root, g: long.get(g))
    last = current_guard.MAX_CHAIN - 1
    assert descends_from(Path("."), "g0", f"g{last}")  # the limit itself is reached
    assert not descends_from(Path("."), "g0", f"g{last + 1}")  # one past it is not


def test_the_current_lock_is_never_followed_through_a_symlink(root, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (root / current_guard.CURRENT_LOCK).unlink(missing_ok=True)
    (root / current_guard.CURRENT_LOCK).symlink_to(victim)
    with pytest.raises(WriteError, match=r"\.current\.lock: cannot open"):
        write_generation(_day1(root, shard_size=1 << 19))
    assert victim.read_text() == "keep"


def test_a_held_lock_fails_after_its_wait_naming_the_file(root, monkeypatch):
    from shards.store.publish import try_lock

    monkeypatch.setattr(current_guard, "LOCK_WAIT_S", 0.2)
    held = try_lock(root / current_guard.CURRENT_LOCK)
    try:
        with pytest.raises(WriteError, match=r"\.current\.lock: held by another process"):
            write_generation(_day1(root, shard_size=1 << 19))
    finally:
        held.close()
    assert not (root / MANIFEST).exists()


# ----------------------------------------------------------------------- the same on S3


def test_write_after_a_night_on_s3_is_refused_from_any_staging(s3, root, tmp_path):
    pytest.importorskip("s3fs")
    from shards.store.object_store import publish_generation, read_remote_current

    url, opts = "s3://bkt/rollback-root", s3["opts"]
    day1 = read_current(root)
    publish_generation(root / day1, url, storage_options=opts)
    stage = tmp_path / "stage"
    night = run_rebalance(
        replace(_night(root, 2), current=url, staging=str(stage), storage_options=opts)
    ).generation
    assert read_remote_current(url, storage_options=opts) == night
    for staging in (stage, tmp_path / "another-machine"):
        cfg = replace(_day1(root), out=url, staging=str(staging), storage_options=opts)
        with pytest.raises(WriteError, match=rf"CURRENT names {night}.*--force"):
            write_generation(cfg)
        assert read_remote_current(url, storage_options=opts) == night
    write_generation(replace(cfg, force=True))
    assert read_remote_current(url, storage_options=opts) == day1


def test_a_grandchild_of_current_moves_it_forward_through_the_manifests(root):
    """A -> B -> C on disk, CURRENT rolled back to A: writing C again walks C's parent B's
    manifest to A, so it is forward (no --force). The walk reads only each manifest's parent:
    a shard of B gone changes nothing; a damaged or unreadable manifest of B ends the walk
    (refused without --force, never a crash)."""
    a = read_current(root)
    b = write_generation(_day1(root, shard_size=1 << 19))
    c = write_generation(_day1(root, shard_size=3 << 18))
    assert (b.parent, c.parent) == (a, b.generation)
    set_current(root, a)
    shard = next((root / b.generation).glob("node-*/rank-*/*.tar"))
    shard.unlink()  # B incomplete: its manifest still names its parent
    assert write_generation(_day1(root, shard_size=3 << 18)).reused
    assert read_current(root) == c.generation
    for damage in ("garbage", "loop"):
        set_current(root, a)
        manifest = root / b.generation / "manifest.json"
        manifest.unlink(missing_ok=True)
        if damage == "garbage":
            manifest.write_text("{not json")
        else:
            manifest.symlink_to(manifest)  # ELOOP: an OSError, not a ManifestError
        with pytest.raises(WriteError, match=f"CURRENT names {a}"):
            write_generation(_day1(root, shard_size=3 << 18))
        assert read_current(root) == a


def test_descends_from_without_a_root_looks_at_the_first_parent_only():
    assert descends_from(None, "a", "a") and not descends_from(None, "b", "a")


def test_the_current_lock_waits_for_a_brief_holder_and_fails_only_after_its_wait(root, monkeypatch):
    """A lock released after the writer waited 0.3 s is waited for, polled every 0.05 s (each wait recorded,
    no clock asserted from above: a loaded machine is slow, never fast); one held past
    LOCK_WAIT_S fails after the wait, not before; a free lock is taken without a wait; the lock
    file is made rw-r--r-- (less the umask). LOCK_WAIT_S and MAX_CHAIN are the documented
    60 s and 10,000."""
    import stat
    import time

    from shards.store.publish import try_lock

    assert (current_guard.LOCK_WAIT_S, current_guard.MAX_CHAIN) == (60.0, 10_000)
    waits = []
    real_sleep = time.sleep
    holder = {}

    def sleep(s):
        waits.append(s)
        real_sleep(s)
        # the holder lets go once the writer has waited 0.3 s: released by the writer's own
        # waits, not by a timer that a loaded machine can fire before the writer comes
        if sum(waits) >= 0.3 and "held" in holder:
            holder.pop("held").close()

    monkeypatch.setattr(file_lock.time, "sleep", sleep)  # the wait current_lock takes
    lock = root / current_guard.CURRENT_LOCK
    lock.unlink(missing_ok=True)
    holder["held"] = try_lock(lock)
    t0 = time.monotonic()
    r = write_generation(_day1(root, shard_size=1 << 19))
    assert read_current(root) == r.generation and time.monotonic() - t0 > 0.25
    assert waits and set(waits) == {0.05}
    umask = os.umask(0)
    os.umask(umask)
    os.unlink(lock)
    with current_guard.current_lock(root):
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o644 & ~umask
    monkeypatch.setattr(current_guard, "LOCK_WAIT_S", 0.4)
    held = try_lock(lock)
    try:
        t0 = time.monotonic()
        with (
            pytest.raises(WriteError, match="held by another process"),
            current_guard.current_lock(root),
        ):
            pass
        assert time.monotonic() - t0 >= 0.4
        held.close()
        waits.clear()
        with current_guard.current_lock(root):  # free now: taken without a wait
            assert waits == []
    finally:
        held.close()
