"""Subprocess for the scale benchmark: build a plan for N resampled rows three times, print the
median time (with that run's phases) and the peak RSS."""

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from balancing.plan import BalanceConfig, build_plan
from bench._internvl import resampled

n = int(sys.argv[1])
table = resampled(n)
build_plan(table.slice(0, 50_000), BalanceConfig(dp=8))  # load the compiled kernels first
runs = []
for _ in range(3):  # the median of three: this VM's timings vary by +-15 % between runs
    t0 = time.perf_counter()
    r = build_plan(table, BalanceConfig(dp=8, target_batch=4))
    runs.append((time.perf_counter() - t0, r.report))
    del r
seconds, report = sorted(runs, key=lambda x: x[0])[1]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
m = report["metrics"]["balanced"]
print(
    json.dumps(
        {
            "rows": n,
            "seconds": round(seconds, 3),
            "peak_rss_mb": round(rss),
            "phases": report["seconds"],
            "dist_ratio_vit": m["dist_ratio_vit"],
            "dist_ratio_llm": m["dist_ratio_llm"],
        }
    )
)
