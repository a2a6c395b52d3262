"""Subprocess for the command rows of the scale benchmark: the commands as a user runs them on N
rows resampled from the real data, each a fresh ``python -m equishard`` process, timed from
outside (wall) with its peak RSS (this worker's only child at that moment).

    python bench/_command_worker.py N WORK_DIR

prints one JSON line: ``balance`` (DP 64 on 8 nodes, reading the cost table and writing the
plan) and ``import_lengths`` (a JSON list of N OmniBal/InternVL entries), each with seconds and
peak RSS."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._internvl import load_lengths, resampled  # noqa: E402


def _timed(args: list[str], work: Path) -> dict:
    """One fresh CLI process: its wall time and its own peak RSS (``wait4``'s usage of it)."""
    log = work / "stderr.txt"
    t0 = time.perf_counter()
    with open(log, "w") as err:
        cmd = [sys.executable, "-m", "equishard", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if status:
        raise SystemExit(f"equishard {args[0]} failed: {log.read_text()[-2000:]}")
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024)}


def main() -> None:
    n, work = int(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    cost = work / "cost.parquet"
    pq.write_table(resampled(n), cost)
    plan = work / "plan"
    balance = _timed(["balance", str(cost), "--dp", "64", "--nodes", "8", "-o", str(plan)], work)
    cost.unlink()
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
                "import_lengths": {**imported, "json_mb": round(size_mb)},
            }
        )
    )


if __name__ == "__main__":
    main()
