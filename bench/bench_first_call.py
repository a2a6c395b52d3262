"""The runtime entry points' first calls in a fresh process (issue 69, item 1), over d ranks x B
samples per rank up to 2560 x 64: with an empty numba cache (a fresh container), with the
install's cache, each with and without ``balancing.prewarm()`` at set-up.

Targets: from the process's start to its first plan <= 1 s of CPU (the interpreter's start and
``import balancing`` included, torch not: a training job has it imported); no call that runs
while the kernels compile (on their twins) takes more than 5x that entry point's steady kernel
call + 50 ms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CELLS = ((64, 4), (512, 16), (2560, 16), (2560, 64))
ENTRY_POINTS = ("post_balance", "locality_balance", "nodewise_permutation", "hf_plan_phase")
CASES = (("empty", "prewarm"), ("empty", "plain"), ("install", "plain"), ("install", "prewarm"))
ROOT = Path(__file__).resolve().parent.parent


def _probe(cache: str, d: int, b: int, how: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "_first_call_probe.py"), str(d), str(b), how],
        env=env, capture_output=True, text=True, check=True, timeout=1200,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rows() -> list[dict]:
    rows = []
    for d, b in CELLS:
        with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as cache:
            for state, how in CASES:  # the empty plain case fills the cache the next two load
                where = first if (state, how) == ("empty", "prewarm") else cache
                got = _probe(where, d, b, how)
                rows.append({"d": d, "B": b, "cache": state, "how": how, **got})
    return rows


def _worst(r: dict) -> tuple[float, str]:
    """The largest ratio of a twin call's time to its limit (5x steady + 50 ms), and which."""
    worst, name = 0.0, "-"
    for k in ENTRY_POINTS:
        if r[f"{k}_twins"]:
            ratio = r[f"{k}_s"] / (5 * r[f"{k}_steady_s"] + 0.05)
            if ratio > worst:
                worst, name = ratio, k
    return worst, name


def markdown(rows: list[dict]) -> str:
    lines = [
        "### First calls in a fresh process",
        "",
        "| d x B | numba cache | import balancing | first plan: CPU (wall) | post_balance | "
        "locality_balance | nodewise_permutation | HF wrapper plan | compile left after them | "
        "steady post_balance / nodewise | worst twin call / (5x steady + 50 ms) | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        worst, name = _worst(r)
        ok = r["first_plan_cpu_s"] <= 1.0 and worst <= 1.0
        calls = " | ".join(
            f"{r[f'{k}_s'] * 1000:.0f} ms" + (" (twins)" if r[f"{k}_twins"] else "")
            for k in ENTRY_POINTS
        )
        cache = {"empty": "empty", "install": "install's"}[r["cache"]]
        if r["how"] == "prewarm":
            cache += " + prewarm, 2 s set-up"
        worst_s = f"{worst:.1f}x ({name})" if name != "-" else "- (no twin call)"
        lines.append(
            f"| {r['d']} x {r['B']} | {cache} | {r['import_s']:.2f} s | "
            f"{r['first_plan_cpu_s']:.2f} s ({r['first_plan_wall_s']:.2f} s) | {calls} | "
            f"{r['compile_s']:.1f} s | {r['post_balance_steady_s'] * 1000:.1f} / "
            f"{r['nodewise_permutation_steady_s'] * 1000:.1f} ms | {worst_s} | "
            + ("met" if ok else "**not met**")
            + " |"
        )
    lines += [
        "",
        "Each row is a fresh process; the empty-cache process without prewarm fills the cache "
        "the next two load (the install's cache: `make install` fills it the same way). "
        "*prewarm, 2 s set-up*: `balancing.prewarm()` right after the import, then 2 s slept "
        "before the first call, as a job builds its model (`balance_model` and the reference "
        "trainer call it). *First plan*: "
        "the process's CPU time (every thread) from its start to `post_balance`'s first plan "
        "returned, the interpreter's start and `import balancing` included; wall in brackets "
        "(with prewarm it includes the 2 s of set-up). The entry points are called in the order "
        "shown, the HF wrapper's plan after `trainer_adapter` is imported (torch, not counted). "
        "*(twins)*: the call ran the pure-Python twins (`balancing/twins.py`) because the "
        "kernels were still compiling; the compile runs in three child processes (one per group "
        "of kernels), started when the first call returns, or at `prewarm()`; *compile left*: "
        "how long after the four calls the kernels were ready. Targets: first plan <= 1 s of "
        "CPU; every twin call <= 5x its entry point's steady kernel call + 50 ms.",
        "",
        "What limits it. *Install's cache*: the first plan costs about 0.8 s of CPU, the "
        "interpreter and `import balancing` (numba's import is 0.19 s of it; the offline planner "
        "and pyarrow load only when used) and, in the first call (0.3 s), loading the kernels and "
        "numba's first dispatch (its registries and scipy's BLAS); `prewarm` moves that off the "
        "first call (1-33 ms, the steady time) but loads every kernel and scipy's solver before "
        "it, so the first plan's CPU rises to about 1 s. *Empty cache*: the twins are pure "
        "Python: at 2560 x 64 (163,840 items) `post_balance`'s twin runs LPT's 163,840 heap "
        "updates (0.17 s) and the refinement's escapes, each a prefix minimum over the items "
        "(0.25 s): 0.7-0.8 s alone against the kernel's 31 ms, where the target is 0.2 s; "
        "`locality_balance`'s and the HF wrapper's twins add the locality pass and a second "
        "refinement. A plan the same to the bit as the kernel's cannot skip those steps. The "
        "compile: three children, 7-9 s on these 2 cores after the first calls (one child: "
        "12-14 s); with prewarm they start at set-up and share the 2 cores with the twin calls "
        "(those calls slow down, the kernels are ready sooner); on a node with a core per group "
        "they do not share. Without prewarm, `nodewise_permutation`'s first call imports "
        "scipy's solver (0.5 s at 64 x 4 and 512 x 16: the worst twin call there).",
        "",
    ]
    return "\n".join(lines)


def run() -> dict:
    rows = _rows()
    text = markdown(rows)
    print(text)
    return {"title": "Runtime first calls", "markdown": text, "raw": {"rows": rows}}


if __name__ == "__main__":
    run()
