"""Build one image + text plan in a checkout given on the command line and print its timing and
a digest of the plan (``bench_phases``' same-data comparison of two commits)."""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time

import pyarrow as pa

root, rows = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, root)

from balancing.plan import BalanceConfig, build_plan  # noqa: E402
from bench import _internvl  # noqa: E402

table = _internvl.resampled(rows, seed=0)
cfg = BalanceConfig(dp=64, nodes=8, target_batch=4, seed=0)
build_plan(table.slice(0, 20_000), cfg)  # the kernels load (or compile) outside the timing
times = []
for _ in range(3):
    t0 = time.perf_counter()
    result = build_plan(table, cfg)
    times.append(time.perf_counter() - t0)
digest = hashlib.sha256()
for name in result.plan.column_names:  # values, not buffers (their padding is not data)
    col = result.plan.column(name)
    digest.update(name.encode())
    if col.type in (pa.string(), pa.large_string()):
        digest.update("\0".join(col.to_pylist()).encode())
    else:
        digest.update(col.to_numpy().tobytes())
print(json.dumps({"seconds": statistics.median(times), "plan_sha256": digest.hexdigest()}))
