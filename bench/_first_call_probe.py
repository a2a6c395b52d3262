"""One fresh process: time the import and the first call of each runtime entry point (run by
``bench_runtime`` with an empty ``NUMBA_CACHE_DIR``; prints one JSON line)."""

from __future__ import annotations

import json
import sys
import time

t0 = time.perf_counter()
import numpy as np  # noqa: E402

from balancing import first_call, locality_balance, nodewise_permutation, post_balance  # noqa: E402
from trainer_adapter.redistribute import RedistributePolicy, _plan_phase  # noqa: E402
from trainer_adapter.topology import Topology  # noqa: E402

out = {"import_s": time.perf_counter() - t0}
d, per = int(sys.argv[1]), 8
b = int(sys.argv[2])
rng = np.random.default_rng(0)
x = rng.integers(300, 4000, d * b).astype(np.float64)
src = np.repeat(np.arange(d), b)
calls = {
    "post_balance": lambda: post_balance(x, d),
    "locality_balance": lambda: locality_balance(x, src, d, per),
    "nodewise_permutation": lambda: nodewise_permutation(src, post_balance(x, d).dest, x, d, per),
    "hf_plan_phase": lambda: _plan_phase(
        x, src, tuple(range(d)), Topology(ranks_per_node=per), RedistributePolicy(), x
    ),
}
for name, fn in calls.items():
    t = time.perf_counter()
    fn()
    out[f"{name}_s"] = time.perf_counter() - t
out["kernels_ready_after"] = first_call.kernels_ready()
t = time.perf_counter()
while not first_call.kernels_ready():  # the background compile the first calls did not wait for
    time.sleep(0.05)
out["compile_s"] = time.perf_counter() - t
t = time.perf_counter()
post_balance(x, d)
out["steady_post_balance_s"] = time.perf_counter() - t
print(json.dumps(out))
