"""Measured cost through the reference trainer: each rank's phase times name the items it ran
(the plan's load of that rank is their cost), ``equishard calibrate`` reads the trainer's own
log back, and every rank derives the same coefficients.

Planted bugs these catch: a rank's timed items that are not what it ran (the items of the
samples it read, before redistribution), the encoder's backward left inside the LLM's time or
the LLM's time holding the exchange's wait, a log record that does not name its generation
step, a fit that depends on the order records arrive in."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from balancing.cost_model import CostModel, PhaseCost
from tests.dist_helper import run_ranks

STEPS = 8
TRUE = {
    "vision": PhaseCost(alpha=3e-6, beta=2e-8, gamma=5e-3),
    "llm": PhaseCost(alpha=4e-5, beta=6e-9, gamma=2e-3),
}


def _train(rank, world, cfg_kw, log):
    from trainer_adapter import TrainConfig
    from trainer_adapter.train.loop import run

    return run(TrainConfig(**cfg_kw, log=log))


@pytest.fixture(scope="module")
def trained(train_generation, tmp_path_factory):
    log = tmp_path_factory.mktemp("cal") / "train.jsonl"
    cfg = {"shards": str(train_generation), "dp": 4, "steps": STEPS, "workers": 0}
    run_ranks(_train, 4, cfg, str(log), timeout=480)
    return log


def _cost(phase: PhaseCost, items) -> float:
    return sum(phase.alpha * n + phase.beta * n * n + phase.gamma for n in items)


def test_each_rank_times_the_items_the_plan_gave_it(trained, train_generation):
    from shards import open_generation
    from trainer_adapter.train.model import VLMConfig

    gen = open_generation(train_generation)
    cfg = VLMConfig.preset("tiny", vocab_size=2048, patch_dim=588, merge=2)
    model = CostModel.from_dims(
        vit_hidden=cfg.vit_hidden,
        vit_layers=cfg.vit_layers,
        llm_hidden=cfg.llm_hidden,
        llm_layers=cfg.llm_layers,
    )
    recs = [json.loads(x) for x in trained.read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(STEPS))
    for r in recs:
        pt = r["phase_times"]
        assert set(pt) == {"vision", "llm"} and all(len(pt[p]["seconds"]) == 4 for p in pt)
        # every token of the step is timed once, on the rank that ran it
        assert sum(map(sum, pt["llm"]["items"])) == r["llm_tokens"]
        assert sum(map(sum, pt["vision"]["items"])) == r["vit_tokens"]
        # the plan's load of each rank is the modeled cost of exactly the items it timed
        for name, phase in (("vision", model.vision), ("llm", model.llm)):
            for items, pred in zip(pt[name]["items"], pt[name]["predicted"], strict=True):
                assert math.isclose(pred, _cost(phase, items), rel_tol=1e-9, abs_tol=1e-6)
        for name in ("vision", "llm"):  # a rank with items spent time on them
            for items, secs in zip(pt[name]["items"], pt[name]["seconds"], strict=True):
                assert secs > 0 if items else secs >= 0
        assert set(r["waits"]) == {"exchange", "loader"}
        assert r["generation"] == gen.generation
        assert r["loader_position"][0][1] == r["step"] % gen.steps
        assert 0 < r["step_report"]["efficiency"] <= 1
        assert r["step_report"]["attribution"] in ("data", "hardware", "loader", "exchange")


def _synthetic(log, out):
    """The trainer's records with each rank's times made by TRUE from its own items."""
    lines = []
    for line in log.read_text().splitlines():
        r = json.loads(line)
        for name, phase in TRUE.items():
            pt = r["phase_times"][name]
            pt["seconds"] = [_cost(phase, it) for it in pt["items"]]
        lines.append(json.dumps(r))
    out.write_text("\n".join(lines) + "\n")
    return out


def test_calibrate_reads_the_trainers_log_and_predicts_its_times(trained, tmp_path):
    log = _synthetic(trained, tmp_path / "synthetic.jsonl")
    out = tmp_path / "cal.json"
    r = subprocess.run(
        [sys.executable, "-m", "equishard", "calibrate", str(log), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["command"] == "calibrate" and summary["counts"]["out"] == STEPS - 2
    model = CostModel.from_calibration(out)
    assert model.calibrated and "sha256" in model.source
    doc = json.loads(out.read_text())
    assert doc["measurements"]["warmup"] == 2 and doc["hardware"].endswith("threads")
    assert doc["model"] == "equishard train --model tiny (fp32)"  # the log says what it trained
    for line in log.read_text().splitlines():
        pt = json.loads(line)["phase_times"]
        for name in ("vision", "llm"):
            phase = getattr(model, name)
            for items, secs in zip(pt[name]["items"], pt[name]["seconds"], strict=True):
                if items:
                    lens = np.array(items, dtype=float)
                    got = phase.of(lens.sum(), (lens * lens).sum(), lens.size)
                    assert math.isclose(got, secs, rel_tol=1e-6), (name, items)
    for name in ("vision", "llm"):
        assert doc["fit"][name]["heldout_median_rel_error"] < 1e-6


def _fit_shuffled(rank, world, log):
    from balancing.calibration_log import calibrate

    lines = Path(log).read_text().splitlines()
    order = np.random.default_rng(rank).permutation(len(lines))
    mine = f"{log}.{rank}"
    with open(mine, "w") as f:
        f.write("\n".join(lines[i] for i in order) + "\n")
    cal = calibrate([mine], warmup=0, heldout=0.0)
    return {n: (f.cost.alpha, f.cost.beta, f.cost.gamma, f.intercept) for n, f in cal.fits.items()}


def test_every_rank_derives_the_same_coefficients(trained, tmp_path):
    """Each rank reads the same records in its own order (a gather's order is any): the
    coefficients are equal to the last bit on every rank."""
    log = _synthetic(trained, tmp_path / "synthetic.jsonl")
    noisy = []
    rng = np.random.default_rng(0)
    for line in log.read_text().splitlines():  # noise, so that the fit is not trivially exact
        r = json.loads(line)
        for pt in r["phase_times"].values():
            pt["seconds"] = [s * (1 + 0.05 * rng.standard_normal()) for s in pt["seconds"]]
        noisy.append(json.dumps(r))
    log.write_text("\n".join(noisy) + "\n")
    got = run_ranks(_fit_shuffled, 3, str(log), timeout=120)
    assert got[0] == got[1] == got[2]
