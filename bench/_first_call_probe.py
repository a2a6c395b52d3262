"""One fresh process: the runtime entry points' first calls (run by ``bench_first_call``; prints
one JSON line). ``argv``: d, B, and ``plain`` or ``prewarm`` (``balancing.prewarm()`` right
after the import, then 2 s of a job's set-up, slept, before the first call)."""

from __future__ import annotations

import json
import sys
import time

t0 = time.perf_counter()
import numpy as np  # noqa: E402

import balancing  # noqa: E402

import_s = time.perf_counter() - t0
d, b, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
per = 8
if how == "prewarm":
    balancing.prewarm()
    time.sleep(2.0)
from balancing import first_call, locality_balance, nodewise_permutation, post_balance  # noqa: E402

rng = np.random.default_rng(0)
x = rng.integers(300, 4000, d * b).astype(np.float64)
src = np.repeat(np.arange(d), b)


def _hf():
    from trainer_adapter.redistribute import RedistributePolicy, _plan_phase
    from trainer_adapter.topology import Topology

    return lambda: _plan_phase(
        x, src, tuple(range(d)), Topology(ranks_per_node=per), RedistributePolicy(), x
    )


twins = not first_call.kernels_ready()  # what post_balance asks first (it starts nothing more)
t = time.perf_counter()
first = post_balance(x, d)
out = {
    "import_s": import_s,
    # CPU of this process from its start to its first plan (the interpreter's start included)
    "first_plan_cpu_s": time.process_time(),
    "first_plan_wall_s": time.perf_counter() - t0,
    "post_balance_s": time.perf_counter() - t,
    "post_balance_twins": twins,
}
calls = {
    "locality_balance": lambda: locality_balance(x, src, d, per),
    "nodewise_permutation": lambda: nodewise_permutation(src, first.dest, x, d, per),
}
for name, fn in calls.items():
    twins = not first_call.kernels_ready()
    t = time.perf_counter()
    fn()
    out[f"{name}_s"] = time.perf_counter() - t
    out[f"{name}_twins"] = twins
t = time.perf_counter()
import trainer_adapter.redistribute  # noqa: E402, F401  (torch: a training job has it imported)

out["torch_import_s"] = time.perf_counter() - t
hf = _hf()
out["hf_plan_phase_twins"] = not first_call.kernels_ready()
t = time.perf_counter()
hf()
out["hf_plan_phase_s"] = time.perf_counter() - t
t = time.perf_counter()
while not first_call.kernels_ready():  # the background compile the first calls did not wait for
    time.sleep(0.05)
out["compile_s"] = time.perf_counter() - t
steady = {"post_balance": lambda: post_balance(x, d), **calls, "hf_plan_phase": hf}
for name, fn in steady.items():
    fn()  # a kernel's first dispatch in this process, outside the steady time
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    out[f"{name}_steady_s"] = min(times)
print(json.dumps(out))
