"""Subprocess for the plan-over-partitions benchmark: ``equishard balance`` of N rows resampled
from the real data made on one machine (the command, a fresh process, its own peak RSS) and over
P partitions on a local Ray cluster (a fresh driver process: each worker's peak, the driver's,
the plan's bytes), twice.

    python bench/_ray_plan_worker.py N P WORK_DIR RUNS
    python bench/_ray_plan_worker.py --drive COST OUT P      (one driver run; one JSON line)

prints one JSON line: ``whole`` (seconds, peak RSS, the report's balanced metrics) and ``ray``
(per run: seconds, each worker's peak RSS, the driver's, a worker's floor -- the same kind of
worker planning 1,000 rows -- the plan's sha256 and the balanced metrics)."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._command_worker import _timed  # noqa: E402
from bench._internvl import resampled  # noqa: E402

DP = ["--dp", "64", "--nodes", "8"]
FLOOR_ROWS = 1000


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _vmhwm_mb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return -1


def _drive(cost: Path, out: Path, parts_n: int) -> dict:
    """The command's work over P partitions on a local Ray cluster of P worker slots."""
    import ray

    from balancing.partitioned import build_partitioned_plan
    from balancing.parts import RayParts, partition_bounds, repeated_ids_message
    from balancing.plan import BalanceConfig, write_plan
    from equishard.common.ray_engine import RayOptions

    ray.init(num_cpus=parts_n, include_dashboard=False, log_to_driver=False)
    opts = RayOptions(address=ray.get_runtime_context().gcs_address)
    cfg = BalanceConfig(dp=64, nodes=8)
    t0 = time.perf_counter()
    n = pq.read_metadata(cost).num_rows
    bounds = partition_bounds(n, parts_n)
    with RayParts(str(cost), bounds, cfg.cost_model, opts) as parts:
        result = build_partitioned_plan(str(cost), cfg, parts, bounds)

        def ids_checked():
            message = repeated_ids_message(str(cost), parts.repeated_ids())
            if message:
                raise ValueError(message)

        write_plan(result, out, before_publish=ids_checked)
        peaks = parts.peaks()
    seconds = time.perf_counter() - t0
    # a worker's floor: the same actor, imports and kernels, planning 1,000 rows
    with RayParts(str(cost), [(0, FLOOR_ROWS)], cfg.cost_model, opts) as floor:
        build_partitioned_plan(str(cost), cfg, floor, [(0, FLOOR_ROWS)])
        floor_peak = floor.peaks()[0]
    ray.shutdown()
    return {
        "seconds": round(seconds, 2),
        "worker_peak_mb": [round(p / 2**20) for p in peaks],
        "worker_floor_mb": round(floor_peak / 2**20),
        "driver_peak_mb": _vmhwm_mb(),
        "sha256": _sha(out / "plan.parquet"),
        "balanced": result.report["metrics"]["balanced"],
        "timings": result.report["seconds"],
    }


def main() -> None:
    if sys.argv[1] == "--drive":
        cost, out, parts_n = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
        print(json.dumps(_drive(cost, out, parts_n)))
        return
    n, parts_n, work, runs = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    work.mkdir(parents=True, exist_ok=True)
    cost = work / "cost.parquet"
    pq.write_table(resampled(n), cost)
    whole = _timed(["balance", str(cost), *DP, "-o", str(work / "whole")], work)
    report = json.loads((work / "whole" / "report.json").read_text())
    whole["balanced"] = report["metrics"]["balanced"]
    got = []
    for k in range(runs):
        out = subprocess.run(
            [sys.executable, __file__, "--drive", str(cost), str(work / f"ray{k}"), str(parts_n)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        got.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(json.dumps({"rows": n, "partitions": parts_n, "cores": os.cpu_count(),
                      "whole": whole, "ray": got}))  # fmt: skip


if __name__ == "__main__":
    main()
