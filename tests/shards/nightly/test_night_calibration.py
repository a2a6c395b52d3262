"""A night with measured costs: ``equishard calibrate``'s file re-plans the generation, and the
training logs flag its steps furthest from their plan.

Planted bugs these catch: a calibration that only the new samples' steps see (kept steps were
even for the old costs), a night that re-plans again with the same calibration (or never sees a
new one: the night key ignoring it), the generation not recording which calibration planned
it, flags taken from another generation's log or from the wrong step."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from shards.nightly.rebalance import RebalanceConfig, run_rebalance
from shards.store.manifest import load_manifest
from shards.store.publish import read_current


def _log(path, generation, steps, far):
    """Step records of ``generation``: four ranks, every time on its prediction except
    generation step ``far``, where rank 2 takes twice its share; plus a record of another
    generation that is further off still (and must not be flagged)."""
    rng = np.random.default_rng(0)
    lines = []
    for k, (gen, s) in enumerate([(generation, s) for s in range(steps)] + [("gen-other", 0)]):
        items = [rng.integers(16, 900, int(rng.integers(1, 5))).tolist() for _ in range(4)]
        llm = [rng.integers(50, 3000, int(rng.integers(1, 4))).tolist() for _ in range(4)]
        v = [2e-6 * sum(i) + 3e-8 * sum(x * x for x in i) + 1e-3 * len(i) for i in items]
        t = [5e-5 * sum(i) + 1e-8 * sum(x * x for x in i) + 2e-3 * len(i) for i in llm]
        measured = list(t)
        if s == far or gen == "gen-other":
            measured[2] *= 2 if s == far else 5
        lines.append(
            {
                "step": k,
                "generation": gen,
                "loader_position": [[0, s]] * 4,
                "phase_times": {
                    "vision": {"seconds": v, "items": items, "predicted": v},
                    "llm": {"seconds": measured, "items": llm, "predicted": t},
                },
            }
        )
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_a_calibration_replans_every_step_once_and_logs_flag_the_worst(root, tmp_path):
    parent = read_current(root)
    n_steps = load_manifest(root / parent).steps
    log = _log(tmp_path / "train.jsonl", parent, n_steps, far=1)
    cal = tmp_path / "cal.json"
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "calibrate", str(log), "-o", str(cal)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    res = run_rebalance(
        RebalanceConfig(current=str(root), calibration=str(cal), step_log=(str(log),))
    )
    assert res.status == "published"
    # every parent step was rebuilt under the measured costs, none kept
    assert res.plan["kept_steps"] == 0
    why = res.plan["rebuilt_because"]  # the last step and leftovers keep their own reason
    assert sum(why.values()) == res.plan["rebuilt_parent_steps"] == n_steps
    assert why["cost model changed"] == n_steps - why.get("short last step", 0) - why.get(
        "ISF leftover group", 0
    )
    gen = load_manifest(root / res.generation)
    assert gen.totals["samples"] == load_manifest(root / parent).totals["samples"]
    source = gen.report["parameters"]["cost_model"]["source"]
    assert source.startswith(f"calibration {cal} (sha256 ")
    # the parent's step 1 is flagged first; the other generation's worse record is not
    flagged = res.flagged
    assert flagged["steps"][0]["step"] == 1 and flagged["steps"][0]["distance"] > 0.3
    assert all(s["distance"] < 0.05 for s in flagged["steps"][1:])
    assert flagged["other_generations"] == 1 and flagged["records"] == n_steps + 1
    # the same night again: done already; the same calibration on the new generation: nothing
    again = run_rebalance(RebalanceConfig(current=str(root), calibration=str(cal)))
    assert again.generation == res.generation
    cal2 = tmp_path / "cal2.json"
    cal2.write_bytes(cal.read_bytes() + b"\n")  # another night key, the same coefficients
    same = run_rebalance(RebalanceConfig(current=str(root), calibration=str(cal2)))
    assert same.status == "unchanged" and read_current(root) == res.generation


def test_a_bad_calibration_or_log_is_a_bad_argument(root, tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text('{"vision": {"alpha": -1, "beta": 0}, "llm": {"alpha": 1, "beta": 0}}')
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "rebalance", "--current", str(root),
         "--calibration", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and f"calibration file {bad}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "rebalance", "--current", str(root),
         "--calibration", str(bad), "--step-log", str(tmp_path / "missing.jsonl")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2
