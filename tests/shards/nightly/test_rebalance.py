"""Nightly rebalancing: counts add up over nights, reruns are no-ops, crashes resume to the same
generation, readers of the old generation keep reading, and the report renders."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from shards import GroupDataset, RankInfo, open_generation, verify_generation
from shards.nightly.rebalance import RebalanceConfig, run_rebalance
from shards.store.publish import read_current
from tests.shards.night_helpers import _night, _rebalance_cmd


def _all_samples(gen) -> dict[str, dict]:
    m = open_generation(gen)
    out = {}
    for b in GroupDataset(m, RankInfo(rank=0, world_size=1), shuffle=False):
        for s in b["samples"]:
            assert s.meta["sample_id"] not in out, "a sample twice"
            out[s.meta["sample_id"]] = s.meta
    assert len(out) == m.totals["samples"]
    return out


def _ids(path: Path) -> list[str]:
    return [json.loads(x)["id"] for x in path.read_text().splitlines()]


def test_two_nights_add_update_delete_and_count(root):
    raw = root.parent / "raw"
    day1 = set(_ids(raw / "day-1.jsonl"))
    g0 = read_current(root)
    r2 = run_rebalance(_night(root, 2))
    r3 = run_rebalance(_night(root, 3))
    for r in (r2, r3):
        c = r.counts
        assert r.status == "published"
        assert c["out"] == c["carried_in"] + c["new"] - c["deleted"]
        assert c["updated"] == 5 and c["deleted"] == 3
    assert r3.counts["carried_in"] == r2.counts["out"]
    want, revised_want = set(day1), set()
    for k in (2, 3):
        ids = _ids(raw / f"day-{k}.jsonl")
        revised_want |= want & set(ids)  # ids seen before come back revised
        want |= set(ids)
        gone = set((raw / f"day-{k}.delete").read_text().split())
        want -= gone
        revised_want -= gone
    got = _all_samples(root)
    assert set(got) == want  # nothing lost, nothing duplicated (checked while reading)
    revised = {i for i, meta in got.items() if "(revised on day" in meta["turns"][-1][1]}
    assert revised == revised_want and len(revised) >= 8  # updates carry their new content
    m = open_generation(root)
    assert m.generation == r3.generation and m.parent == r2.generation
    assert open_generation(root / r2.generation).parent == g0
    assert verify_generation(root).ok
    assert r3.plan["kept_steps"] > 0  # balanced steps of the parent were kept as they were
    bal = r3.balance["balanced"]
    assert bal["dist_ratio_llm"] < r3.balance["random"]["dist_ratio_llm"] / 2


def test_same_night_twice_is_a_no_op(root):
    first = run_rebalance(_night(root, 2))
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    again = run_rebalance(_night(root, 2))
    assert again.status == "unchanged" and again.generation == first.generation
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    assert after == before  # nothing written


def test_unchanged_resubmission_is_not_reread(root):
    raw = root.parent / "raw"
    again = raw / "again.jsonl"
    again.write_text((raw / "day-1.jsonl").read_text())
    r = run_rebalance(RebalanceConfig(current=str(root), new=(str(again),)))
    assert r.status == "unchanged"
    assert r.counts["not_reread"] == r.counts["read"] == len(_ids(again))
    assert r.counts["unchanged_resubmitted"] == r.counts["read"]


def _run_night_subprocess(root: Path, k: int) -> subprocess.Popen:
    raw = root.parent / "raw"
    night = ("--new", str(raw / f"day-{k}.jsonl"), "--delete", str(raw / f"day-{k}.delete"))
    return subprocess.Popen(
        _rebalance_cmd(root, *night, "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_killed_at_random_points_resumes_to_the_same_generation(night1, tmp_path):
    work = tmp_path / "work"
    root = work / "shards"
    shutil.copytree(night1.parent, work)
    clean = run_rebalance(_night(root, 2)).generation  # the uninterrupted run, same paths
    shutil.rmtree(work)
    shutil.copytree(night1.parent, work)
    g0 = read_current(root)
    for delay in (0.4, 0.9, 1.3, 1.8, 2.4):
        p = _run_night_subprocess(root, 2)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        cur = read_current(root)
        assert cur in (g0, clean)  # CURRENT names a complete generation, old or new
        assert verify_generation(root / cur).ok
    done = _run_night_subprocess(root, 2)
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err.decode()
    assert json.loads(out.decode().strip().splitlines()[-1])["generation"] == clean
    assert read_current(root) == clean and verify_generation(root).ok
    assert not list(root.glob(".nightly-*")) and not list(root.glob(".staging-*"))


def test_reader_of_the_old_generation_keeps_reading(root):
    old = open_generation(root)
    ds = GroupDataset(root, RankInfo(rank=0, world_size=1), shuffle=False)
    it = iter(ds)
    first = [next(it) for _ in range(3)]
    run_rebalance(_night(root, 2))  # publishes while the reader is mid-epoch
    run_rebalance(_night(root, 3))
    rest = list(it)
    ids = [s.meta["sample_id"] for b in first + rest for s in b["samples"]]
    assert len(ids) == len(set(ids)) == old.totals["samples"]
    assert read_current(root) != old.generation and (root / old.generation).exists()  # keep=3


def test_keep_removes_old_generations_but_never_current(root):
    g0 = read_current(root)
    run_rebalance(_night(root, 2, keep=1))
    assert not (root / g0).exists()
    cur = read_current(root)
    assert (root / "errors" / f"{cur}.errors.parquet").is_file()  # the night's rejects, by name
    run_rebalance(_night(root, 3, keep=1))
    assert not (root / cur).exists() and (root / read_current(root)).exists()
    # a removed generation's errors table goes with it (errors/ would grow every night); the
    # kept one's stays
    errors = {p.name for p in (root / "errors").glob("gen-*.errors.parquet")}
    assert errors == {f"{read_current(root)}.errors.parquet"}


def test_a_crashed_collections_trash_is_removed_by_the_next(root):
    """Retention renames a generation to ``.trash-NAME`` (gone at once for readers), then deletes
    it: a run killed in between leaves the trash, which the next collection removes."""
    run_rebalance(_night(root, 2, keep=1))
    trash = root / ".trash-gen-killed"
    (trash / "n0").mkdir(parents=True)
    (trash / "n0" / "shard.tar").write_bytes(b"x" * 100)
    run_rebalance(_night(root, 3, keep=1))
    assert not trash.exists()


def test_exit_codes_for_a_scheduler(root, tmp_path):
    r = subprocess.run(_rebalance_cmd(root), capture_output=True, text=True)
    assert r.returncode == 2 and "nothing to do" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{broken\n" * 20)
    g0 = read_current(root)
    r = subprocess.run(
        _rebalance_cmd(root, "--new", str(bad), "--json"), capture_output=True, text=True
    )
    assert r.returncode == 1 and json.loads(r.stdout)["status"] == "failed"
    assert read_current(root) == g0


def test_report_is_self_contained(root, tmp_path):
    from shards.read.report import render_report

    run_rebalance(_night(root, 2))
    out = render_report(root, tmp_path / "r.html")
    page = out.read_text()
    assert page.count("data:image/png;base64,") >= 4
    assert "Since the parent generation" in page and "http" not in page.replace("http-equiv", "")


def _chromium_flags() -> list[str]:
    """The headless flags tools/docs_render_check.py starts Chromium with."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "tools" / "docs_render_check.py"
    spec = importlib.util.spec_from_file_location("docs_render_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FLAGS


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_report_renders_in_headless_chromium(root, tmp_path):
    from PIL import Image

    from shards.read.report import render_report

    out = render_report(root, tmp_path / "r.html")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            "chromium",
            *_chromium_flags(),
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1300,2400",
            f"--screenshot={shot}",
            out.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    img = Image.open(shot).convert("L")
    assert img.size == (1300, 2400)
    hist = img.histogram()
    assert sum(hist[:200]) > 0.02 * sum(hist)  # plots and text drew something, not a blank page


def test_rebuilt_samples_come_from_the_parent_shards_not_the_raw_files(root):
    raw = root.parent / "raw"
    before = set(_all_samples(root))
    # yesterday's input is archived away: carried samples must still be written
    # (the first night's cost table points at the original file, so move that one's copy)
    meta = json.loads((root / read_current(root) / "manifest.json").read_text())
    day1 = Path(meta["prep"]["read_options"]["image_root"]) / "day-1.jsonl"
    moved = day1.with_suffix(".archived")
    os.replace(day1, moved)
    try:
        r = run_rebalance(_night(root, 2))
    finally:
        os.replace(moved, day1)
    assert r.status == "published" and r.plan["rebuilt_parent_steps"] > 0
    got = _all_samples(root)
    gone = set((raw / "day-2.delete").read_text().split())
    assert before - gone <= set(got)


def test_inspect_shows_a_nights_generation(root, capsys):
    """A night records the image root of each input as [input, root] pairs; inspect read them
    as a mapping (bug: 'equishard inspect' failed with AttributeError on every nightly
    generation). Its summary names the roots and the night's counts, and --json holds them."""
    from equishard.cli import main

    r = run_rebalance(_night(root, 2))
    assert main(["inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert main(["inspect", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    roots = {p[1] for p in info["prep"]["read_options"]["image_roots"]}
    assert len(roots) == 1 and f"image root(s) {roots.pop()}\n" in out
    c = r.counts
    assert f"{c['carried_in']} carried + {c['new']} new - {c['deleted']} deleted" in out
