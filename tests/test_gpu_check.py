"""The GPU command (``tools/gpu_check.sh``) in its CPU dry run: every step runs the code path it
runs on a GPU (the probe's kernels, the simulated DP, ``equishard train``, ``pytest -m gpu``
collected, the 1F1B replay) at tiny sizes, and its summary holds each step's results.

Planted bugs this catches: a step that no longer runs (an import or argument rotted since the
last GPU run), a result the summary drops, a chunked loss or a stage under bf16 that drifts from
its reference, a cut sample's attention falling to the math kernel (as the probe's own call did in
H200 run 9), a failed or skipped step that still exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu_check.sh"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    res = _run(out, "--dry-run")
    return res, out, json.loads((out / "summary.json").read_text())


def test_every_step_runs_in_the_dry_run_and_the_summary_holds_its_results(dry_run):
    res, out, summary = dry_run
    assert res.returncode == 0, res.stdout + res.stderr
    steps = summary["steps"]
    assert list(steps) == ["probe", "hf_dp", "train", "pytest_gpu", "pipeline"]
    assert all(s["status"] == "ok" for s in steps.values()), steps
    # the device tool brings back at most 8 files: the summary, the driver's log, one per step
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.json", "gpu_check.log", *(f"{n}.log" for n in steps)]
    )

    probe = steps["probe"]["result"]
    assert not any("error" in probe[k] for k in ("attention", "loss", "pipeline_stage"))
    assert probe["loss"]["loss_chunked"] == pytest.approx(probe["loss"]["loss_full"], rel=1e-5)
    assert max(probe["loss"]["grad_rel_diff"]) < 1e-3
    assert probe["attention"]["cut_sample_rel_diff"] < 2e-2  # bf16 against fp32
    # a cut sample's attention in a fused kernel (the CPU's flash), not the math one
    cut = probe["attention"]["cut_sample_kernels_lower_right_bias"]
    assert any("flash" in k for k in cut) and not any("math" in k for k in cut), cut
    assert probe["pipeline_stage"]["cut_samples"] >= 1
    assert probe["pipeline_stage"]["bf16_vs_fp32_grad_cosine"] > 0.99

    rows = steps["hf_dp"]["result"]["rows"]
    assert len(rows) == 5
    assert all(0 < r["efficiency"] <= 1 and r["tokens_per_s"] > 0 for r in rows.values())

    train = steps["train"]["result"]["auto"]
    assert train["steps"] == 2 and train["precision"] == "bf16" and train["tokens_per_s"] > 0
    assert train["compiled_blocks"] == 6  # --compile: the tiny model's 2 ViT and 4 LLM blocks
    assert train["profile"]["steps"] == 1 and train["profile"]["top_host"]  # step 1 profiled

    assert steps["pytest_gpu"]["result"]["returncode"] == 0  # collected
    layouts = steps["pipeline"]["result"]["layouts"]
    assert layouts and all("steps" in lay and lay["steps"] for lay in layouts)


def test_a_spent_budget_or_an_unknown_step_is_not_a_success(tmp_path):
    res = _run(tmp_path / "a", "--dry-run", "--budget", "1", "--only", "probe")
    assert res.returncode == 1
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["steps"]["probe"]["status"] == "skipped"
    res = _run(tmp_path / "b", "--dry-run", "--only", "probe,warp")
    assert res.returncode == 2 and "unknown step(s) warp" in res.stderr


def test_every_gpu_training_variant_is_a_valid_train_command():
    """The GPU run's variants beyond the dry run's (their flags would otherwise first meet the
    parser on a lent GPU): each parses as `equishard train` and gives a valid TrainConfig."""
    sys.path.insert(0, str(ROOT / "tools"))
    from gpu_check import TRAIN_VARIANTS

    from equishard.cli import build_parser
    from trainer_adapter.train.config import TrainConfig

    parser = build_parser()
    for name, (env, args) in TRAIN_VARIANTS.items():
        base = ["train", "--shards", "gen", "--nproc", "1", "--dp", "1", "--model", "1b"]
        a = parser.parse_args(
            [*base, "--recompute", "adaptive", "--memory-fraction", "0.55", *args]
        )
        cfg = TrainConfig(shards="gen", dp=1, recompute=a.recompute, precision="bf16",
                          memory_fraction=a.memory_fraction, compile=a.compile, steps=a.steps,
                          profile="p", profile_steps=a.profile_steps)  # fmt: skip
        assert cfg.steps >= 6, name
        assert all(k in ("EQUISHARD_SDPA", "PYTORCH_CUDA_ALLOC_CONF") for k in env), name


def test_the_longest_run_is_calibrated(tmp_path):
    """The GPU command fits costs to its longest training log (CUDA-event phase times of one
    rank); a log too short for a fit (the dry run's two steps) gives none, not a failure."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    rng = __import__("numpy").random.default_rng(0)

    def log(path, steps):
        lines = []
        for s in range(steps):
            pt = {}
            for name, (a, b) in (("vision", (2e-6, 3e-8)), ("llm", (5e-5, 1e-8))):
                items = [rng.integers(16, 900, int(rng.integers(1, 5))).tolist()]
                pt[name] = {"seconds": [a * sum(items[0]) + b * sum(x * x for x in items[0])],
                            "items": items}  # fmt: skip
            lines.append(json.dumps({"step": s, "phase_times": pt}))
        path.write_text("\n".join(lines) + "\n")

    log(tmp_path / "train-0.jsonl", 2)
    assert gpu_check._calibrate(tmp_path, 1) is None
    log(tmp_path / "train-1.jsonl", 20)
    got = gpu_check._calibrate(tmp_path, 2)
    assert got["log"] == "train-1.jsonl" and got["status"] == "ok"
    assert got["phases"]["llm"]["alpha"] == pytest.approx(5e-5, rel=1e-4)
    assert (tmp_path / "calibration.json").exists()
