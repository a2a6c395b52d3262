"""Subprocess for the command rows of the scale benchmark: the commands as a user runs them on N
rows resampled from the real data, each a fresh ``equishard`` process, timed from outside
(wall), with its own peak RSS.

    python bench/_command_worker.py N WORK_DIR [balance]

prints one JSON line: ``balance`` (DP 64 on 8 nodes, reading the cost table and writing the
plan) and ``import_lengths`` (a JSON list of N OmniBal/InternVL entries), each with seconds and
peak RSS (the process's own VmHWM); with ``balance``, that command alone."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._internvl import load_lengths, resampled  # noqa: E402

# the command in a fresh interpreter that reports its own peak RSS at exit: VmHWM belongs to
# the address space made at exec, whereas wait4's ru_maxrss also counts the high-water mark of
# the forking parent's (this worker's) address space that exec replaced
_SHIM = """
import atexit, runpy, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("VMHWM_KB", line.split()[1], file=sys.stderr)
atexit.register(peak)
sys.argv = ["equishard", *sys.argv[1:]]
runpy.run_module("equishard", run_name="__main__")
"""


_TOUCH = """
import os, sys, time
import numpy as np
n = int(sys.argv[1])
t0 = time.perf_counter()
a = np.ones(n, np.int8)
first = time.perf_counter() - t0
del a
t0 = time.perf_counter()
a = np.ones(n, np.int8)
print(first, time.perf_counter() - t0, os.times().system)
"""


def _timed(args: list[str], work: Path) -> dict:
    """One fresh CLI process: its wall time, its CPU time (user + system, its threads and
    children included) and its own peak RSS."""
    import resource

    log = work / "stderr.txt"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as err:
        cmd = [sys.executable, "-c", _SHIM, *args]
        code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT).returncode
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = log.read_text()
    if code:
        raise SystemExit(f"equishard {args[0]} failed: {text[-2000:]}")
    kb = int(text.rsplit("VMHWM_KB", 1)[1].split()[0])
    return {"seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
            "peak_rss_mb": round(kb / 1024)}  # fmt: skip


def main() -> None:
    n, work = int(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    cost = work / "cost.parquet"
    pq.write_table(resampled(n), cost)
    plan = work / "plan"
    balance = _timed(["balance", str(cost), "--dp", "64", "--nodes", "8", "-o", str(plan)], work)
    cost.unlink()
    if sys.argv[3:] == ["balance"]:  # the balance command alone (the peak's growth with rows)
        print(json.dumps({"rows": n, "balance": balance}))
        return
    # this machine's price of fresh memory: a fresh process touching as many bytes as the
    # balance command's peak, once (pages never used by it) and again (pages it already has)
    touch = subprocess.run(
        [sys.executable, "-c", _TOUCH, str(balance["peak_rss_mb"] << 20)],
        capture_output=True,
        text=True,
        check=True,
    )
    first, again, sys_s = (float(x) for x in touch.stdout.split())
    # the lengths file as OmniBal/InternVL write it, written in slices to keep this worker small
    tiles, llm = load_lengths()
    idx = np.random.default_rng(1).integers(0, tiles.size, n)
    lengths = work / "lengths.json"
    with open(lengths, "w") as f:
        f.write("[")
        for start in range(0, n, 1_000_000):
            part = idx[start : start + 1_000_000]
            f.write(
                ("," if start else "")
                + ",".join(
                    f'{{"vit_num": {int(tiles[i])}, "token_num": {int(llm[i])}, '
                    f'"image_flags": {int(tiles[i])}}}'
                    for i in part
                )
            )
        f.write("]")
    size_mb = lengths.stat().st_size / 2**20
    imported = _timed(["import-lengths", str(lengths), "-o", str(work / "imported.parquet")], work)
    lengths.unlink()
    print(
        json.dumps(
            {
                "rows": n,
                "balance": balance,
                "touch": {"first": first, "again": again, "sys_seconds": sys_s},
                "import_lengths": {**imported, "json_mb": round(size_mb)},
            }
        )
    )


if __name__ == "__main__":
    main()
