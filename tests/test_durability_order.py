"""Durability by order: every file a stage publishes is flushed (``fsync``) before the rename
that publishes it, and its directory is flushed after. A SIGKILL test cannot see a missing
``fsync`` (the page cache survives a killed process; only a power loss loses it), so these
tests record the calls themselves, in every thread, and check their order for each rename.

Found by this test: prep's cost table and errors table, balance's plan and report, merge's and
import-lengths' tables were renamed into place without an fsync (a power loss could leave an
empty cost table under its real name)."""

from __future__ import annotations

import os
import threading

import pytest

from tests.shards.night_helpers import _night, first_night


class Recorder:
    """Records ``fsync`` (by the path its descriptor is open on) and ``os.replace`` /
    ``os.rename`` (with whether the source was a directory), in call order."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple] = []
        self._lock = threading.Lock()
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd):
            real_fsync(fd)
            path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
            with self._lock:
                self.events.append(("fsync", path))

        def moved(real):
            def move(src, dst, *a, **k):
                if k.get("src_dir_fd") is not None:  # relative to a directory's descriptor
                    return real(src, dst, *a, **k)
                is_dir = os.path.isdir(src)
                inside = []  # a directory published whole: the files it holds, by their path then
                if is_dir:
                    base = os.path.realpath(src)
                    for d, _, files in os.walk(base):
                        inside += [os.path.join(d, f) for f in files]
                    inside = [f for f in inside if os.path.getsize(f)]  # empty: no data to lose
                real(src, dst, *a, **k)
                with self._lock:
                    self.events.append(
                        ("rename", os.path.realpath(src), os.path.realpath(dst), is_dir, inside)
                    )

            return move

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", moved(real_replace))
        monkeypatch.setattr(os, "rename", moved(real_rename))

    def problems(self) -> list[str]:
        out = []
        for i, ev in enumerate(self.events):
            if ev[0] != "rename":
                continue
            _, src, dst, is_dir, inside = ev
            if os.path.basename(dst).startswith((".trash", ".fetch")):
                continue  # a removal on its way out, not a publish
            before = self.events[:i]
            if not is_dir and ("fsync", src) not in before:
                out.append(f"{dst}: renamed from {os.path.basename(src)} before an fsync of it")
            flushed = {e[1] for e in before if e[0] == "fsync"}
            # a file renamed into the directory earlier was flushed under its older name
            for e in before:
                if e[0] == "rename" and e[1] in flushed:
                    flushed.add(e[2])
            out += [
                f"{dst}: published holding {os.path.relpath(f, src)}, never fsynced"
                for f in inside
                if f not in flushed
            ]
            after = self.events[i + 1 :]
            if ("fsync", os.path.dirname(dst)) not in after:
                out.append(f"{dst}: its directory was not fsynced after the rename")
        return out

    def renamed(self) -> set[str]:
        return {os.path.basename(e[2]) for e in self.events if e[0] == "rename"}


def test_every_stage_flushes_before_it_renames_and_after(tmp_path, monkeypatch):
    """Prep, balance, write and a night's rebalance of the demo set: each published file
    (cost and errors tables, plan and report, shards, sidecars, manifest, the generation
    directory, CURRENT) is fsynced before its rename and its directory after."""
    rec = Recorder(monkeypatch)
    root = first_night(tmp_path)
    from shards.nightly.rebalance import run_rebalance

    assert run_rebalance(_night(root, 2)).status == "published"
    names = rec.renamed()
    for want in ("cost.parquet", "cost.errors.parquet", "plan.parquet", "report.json"):
        assert want in names, sorted(names)
    assert "CURRENT" in names and "manifest.json" in names
    assert any(n.startswith("shard-") and n.endswith(".tar") for n in names)
    assert any(n.startswith("gen-") for n in names)  # the generation directory itself
    assert any(e[0] == "rename" and e[3] and len(e[4]) > 5 for e in rec.events)
    assert not rec.problems(), rec.problems()[:10]


def test_merge_and_import_lengths_flush_before_they_rename(tmp_path, monkeypatch):
    import json

    from dataprep import PrepConfig, make_demo, run_prep
    from dataprep.import_lengths import ImportLengthsConfig, import_lengths
    from dataprep.merge import merge_cost_tables

    demo = tmp_path / "demo"
    make_demo(demo, samples=20, seed=1, images=4)
    parts = []
    for k in range(2):
        out = tmp_path / f"part-{k}.parquet"
        run_prep(
            PrepConfig(
                inputs=(str(demo / "demo.jsonl"),),
                output=str(out),
                tokenizer=str(demo / "tokenizer.json"),
                shard_index=k,
                num_shards=2,
            )
        )
        parts.append(str(out))
    src = tmp_path / "lengths.json"
    src.write_text(json.dumps([{"vit_num": 2, "token_num": 600, "image_flags": 2}]))
    rec = Recorder(monkeypatch)
    merge_cost_tables(parts, str(tmp_path / "merged.parquet"))
    import_lengths(ImportLengthsConfig(inputs=(str(src),), output=str(tmp_path / "l.parquet")))
    assert {"merged.parquet", "l.parquet", "l.errors.parquet"} <= rec.renamed()
    assert not rec.problems(), rec.problems()


def test_the_recorder_sees_a_rename_before_its_fsync(tmp_path, monkeypatch):
    """The check itself: a rename with no fsync first, or no directory fsync after, is named."""
    rec = Recorder(monkeypatch)
    a = tmp_path / "a.tmp"
    a.write_bytes(b"x")
    os.replace(a, tmp_path / "a")
    assert rec.problems() == [
        f"{tmp_path / 'a'}: renamed from a.tmp before an fsync of it",
        f"{tmp_path / 'a'}: its directory was not fsynced after the rename",
    ]
    from equishard.common.durable import durable_replace

    rec.events.clear()
    a.write_bytes(b"y")
    durable_replace(a, tmp_path / "a")
    assert rec.problems() == []
    d = tmp_path / "d.tmp"
    d.mkdir()
    (d / "f").write_bytes(b"z")
    rec.events.clear()
    os.replace(d, tmp_path / "d")
    from equishard.common.durable import fsync_dir

    fsync_dir(tmp_path)
    assert rec.problems() == [f"{tmp_path / 'd'}: published holding f, never fsynced"]


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")
