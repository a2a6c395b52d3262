"""SIGKILL of a `prep` or `write` run with worker processes leaves no worker alive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from balancing.plan import BalanceConfig, build_plan, write_plan
from dataprep import PrepConfig, make_demo, read_cost_table, run_prep


def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _kill_once_workers_run(cmd: list[str], workers: int) -> set[int]:
    # the writer runs at most half the cores' processes: seen as 8 cores, it starts its workers
    env = {**os.environ, "EQUISHARD_CORES": "8"}
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    kids: set[int] = set()
    while time.monotonic() < deadline and p.poll() is None:
        kids = _children(p.pid)
        if len(kids) >= workers:
            time.sleep(0.3)  # past their start-up
            kids = _children(p.pid)
            break
        time.sleep(0.02)
    assert p.poll() is None and len(kids) >= workers, "the run ended before its workers started"
    p.send_signal(signal.SIGKILL)
    p.wait()
    return kids


def _all_gone(kids: set[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(k) for k in kids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def big_demo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("orphans")
    make_demo(root / "raw", samples=3000, seed=2, images=30)
    return root


pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")


def test_killed_prep_leaves_no_workers(big_demo, tmp_path):
    raw = big_demo / "raw"
    cmd = [
        sys.executable, "-m", "equishard", "prep", str(raw / "demo.jsonl"),
        "--tokenizer", str(raw / "tokenizer.json"), "--workers", "2", "--chunk-size", "64",
        "-o", str(tmp_path / "cost.parquet"),
    ]  # fmt: skip
    kids = _kill_once_workers_run(cmd, 2)
    assert _all_gone(kids), f"orphaned prep workers: {[k for k in kids if _alive(k)]}"
    # the next run cleans what the killed one left and completes
    run_prep(
        PrepConfig(
            inputs=(str(raw / "demo.jsonl"),),
            output=str(tmp_path / "cost.parquet"),
            tokenizer=str(raw / "tokenizer.json"),
        )
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.errors.parquet", "cost.parquet"]


def test_killed_write_leaves_no_workers(big_demo, tmp_path):
    raw = big_demo / "raw"
    cost = big_demo / "cost.parquet"
    if not cost.exists():
        run_prep(
            PrepConfig(
                inputs=(str(raw / "demo.jsonl"),),
                output=str(cost),
                tokenizer=str(raw / "tokenizer.json"),
            )
        )
    plan = tmp_path / "plan"
    write_plan(build_plan(read_cost_table(cost), BalanceConfig(dp=4, nodes=2)), plan)
    out = tmp_path / "shards"
    cmd = [
        sys.executable, "-m", "equishard", "write", str(plan), "--cost-table", str(cost),
        "--out", str(out), "--workers", "3", "--shard-size", "64KB",
    ]  # fmt: skip
    kids = _kill_once_workers_run(cmd, 2)  # two spawned workers beside the writing process
    assert _all_gone(kids), f"orphaned writer workers: {[k for k in kids if _alive(k)]}"
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    time.sleep(1.0)
    after = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert before == after  # nobody writes any more
    assert os.path.isdir(out)
