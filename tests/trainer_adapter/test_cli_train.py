"""``equishard train`` end to end through torchrun (gloo), and its argument checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _equishard(*args, timeout=600, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "equishard", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


def test_train_runs_through_torchrun(train_generation, tmp_path):
    """Run from a folder holding data folders named like equishard's packages (``shards/``
    beside a training script is the usual layout). Planted bug this catches: an editable
    install whose import hook comes after Python's path search, where ``./shards`` (no
    ``__init__.py``) became the package ``shards`` in the command and in every rank
    (``ImportError: cannot import name 'GroupDataset' from 'shards' (unknown location)``)."""
    work = tmp_path / "work"
    for name in ("shards", "dataprep", "balancing", "trainer_adapter"):
        (work / name).mkdir(parents=True)
        (work / name / "data.txt").write_text("a user's files")
    log = tmp_path / "log.jsonl"
    r = _equishard(
        "train",
        "--shards",
        str(train_generation),
        "--nproc",
        "2",
        "--dp",
        "2",
        "--steps",
        "2",
        "--workers",
        "0",
        "--log",
        str(log),
        "--profile",
        str(tmp_path / "prof"),
        "--profile-steps",
        "1:2",
        cwd=work,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step    1" in r.stdout and "train: 2 steps" in r.stdout
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(recs) == 2 and all(x["bytes_inter_node"] == 0 for x in recs)  # one node
    # the profiled window is step 1 alone, on every rank
    assert [x["profiled"] for x in recs] == [False, True]
    assert "profile: steps 1:2" in r.stdout
    for rank in (0, 1):
        summary = json.loads((tmp_path / "prof" / f"rank{rank}-summary.json").read_text())
        assert summary["steps"] == 1 and summary["device_busy_s"] is None  # no GPU here
        assert any(op["name"] in ("aten::mm", "aten::addmm") for op in summary["top_host"])
        assert "aten::" in (tmp_path / "prof" / f"rank{rank}-ops.txt").read_text()
    summary0 = json.loads((tmp_path / "prof" / "rank0-summary.json").read_text())
    assert summary0["wall_s"] == recs[1]["seconds"]


def test_train_rejects_a_layout_that_does_not_add_up(train_generation):
    r = _equishard("train", "--shards", str(train_generation), "--nproc", "3", "--dp", "2")
    assert r.returncode != 0 and "must equal --dp x --pp" in r.stderr
    # a typo's rank count fails at once, naming the limit, instead of forking that many ranks
    n = str(10**9)
    r = _equishard("train", "--shards", str(train_generation), "--nproc", n, "--dp", n, timeout=60)
    assert r.returncode != 0 and f"--nproc {n}: equishard train starts every rank" in r.stderr


# make test-slow (CI): a second torchrun launch for one flag; make test launches one
# (test_train_runs_through_torchrun) and checks recomputation in process (test_recompute.py)
@pytest.mark.slow
def test_recompute_flag_reaches_the_ranks(train_generation):
    """--recompute adaptive measures GPU memory: on a CPU the ranks refuse it by name."""
    r = _equishard(
        "train",
        "--shards",
        str(train_generation),
        "--nproc",
        "1",
        "--dp",
        "1",
        "--steps",
        "1",
        "--workers",
        "0",
        "--recompute",
        "adaptive",
        "--backend",
        "gloo",
    )
    assert r.returncode != 0 and "measures GPU memory" in r.stdout + r.stderr


def test_backend_choice():
    import pytest

    from trainer_adapter.train.loop import resolve_backend

    assert resolve_backend("auto", 0, 4, False, 0) == "gloo"
    assert resolve_backend("auto", 1, 2, True, 2) == "nccl"
    assert resolve_backend("gloo", 0, 8, True, 1) == "gloo"
    with pytest.raises(ValueError, match="one GPU per process"):
        resolve_backend("auto", 0, 4, True, 1)
    with pytest.raises(ValueError, match="no CUDA"):
        resolve_backend("nccl", 0, 1, False, 0)


def test_a_plan_balanced_for_another_models_costs_is_named(train_generation):
    """The plan report records the cost model the steps were balanced for; training another
    model (its own hidden sizes and layers) trained on steps even for the other model's mix of
    linear and quadratic work, without a word. Anchor: the recorded cost model against the one
    CostModel.from_dims gives for each model's dimensions."""
    from types import SimpleNamespace

    from balancing import CostModel
    from shards import open_generation
    from trainer_adapter.train.loop import plan_cost_note

    m = open_generation(train_generation)
    recorded = m.report["parameters"]["cost_model"]
    same = CostModel.from_dims(vit_hidden=1024, vit_layers=24, llm_hidden=4096, llm_layers=32)
    assert recorded == same.describe()  # balanced with the defaults
    tiny = SimpleNamespace(vit_hidden=32, vit_layers=2, llm_hidden=64, llm_layers=4)
    note = plan_cost_note(m, tiny)
    assert "vision 1024x24, llm 4096x32" in note and "vision 32x2, llm 64x4" in note
    # the same dimensions (or any with the same ratio of quadratic to linear work): no note
    alike = SimpleNamespace(vit_hidden=1024, vit_layers=12, llm_hidden=4096, llm_layers=64)
    assert plan_cost_note(m, alike) is None
    # one kind alike is not enough: the steps weigh the other kind's work by the other model
    half = SimpleNamespace(vit_hidden=1024, vit_layers=24, llm_hidden=64, llm_layers=4)
    assert "vision 1024x24, llm 64x4" in plan_cost_note(m, half)
    half = SimpleNamespace(vit_hidden=32, vit_layers=2, llm_hidden=4096, llm_layers=32)
    assert "vision 32x2, llm 4096x32" in plan_cost_note(m, half)


@pytest.mark.parametrize("mode", ["off", "all"])
def test_recompute_off_and_all_set_every_block(mode):
    """``--recompute all`` recomputes every ViT and LLM block (the pipeline stages' blocks
    when there are stages), ``off`` none: the flag was only seen to reach the ranks."""
    from types import SimpleNamespace

    from trainer_adapter.train.run_setup import set_recompute

    blocks = lambda n, flag: [SimpleNamespace(recompute=flag) for _ in range(n)]  # noqa: E731
    vit, llm, staged = blocks(3, mode == "off"), blocks(4, mode == "off"), blocks(2, mode == "off")
    model = SimpleNamespace(vision=SimpleNamespace(blocks=vit), llm=SimpleNamespace(blocks=llm))
    cfg = SimpleNamespace(recompute=mode)
    set_recompute(cfg, SimpleNamespace(model=model, stages=[]), {}, None)
    assert [b.recompute for b in vit + llm] == [mode == "all"] * 7
    pp = SimpleNamespace(model=model, stages=[SimpleNamespace(blocks=staged)])
    set_recompute(cfg, pp, {}, None)
    assert [b.recompute for b in vit + staged] == [mode == "all"] * 5


# make test-slow (CI): a second torchrun launch, with recordings; make test launches one
# (test_train_runs_through_torchrun) and trains every DP x PP layout with the audio encoder in
# process (test_audio_training.py)
@pytest.mark.slow
def test_train_on_a_generation_with_recordings(tmp_path, tokenizer_path):
    """A generation with images, InternVL videos and recordings (Qwen2.5-Omni's kind of rule,
    2-s window) trains under DP 1 x PP 2: the loop builds the audio encoder from the recorded
    rule, the second stage's empty batch carries the audio keys (without them the audio phase's
    collectives fail), and each step's log names the audio phase with the recordings it ran."""
    from tests.shards.media_generation import RULES, VIDEO_RULE, build_audio_generation

    gen = build_audio_generation(
        tmp_path / "g", RULES["chunks"], tokenizer_path, dp=1, video_rule=VIDEO_RULE
    )
    log = tmp_path / "log.jsonl"
    r = _equishard("train", "--shards", str(gen), "--nproc", "2", "--dp", "1", "--pp", "2",
                   "--steps", "2", "--workers", "0", "--log", str(log))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "audio " in r.stdout.splitlines()[-2]
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert all("audio" in x["methods"] for x in recs)
    ran = [x["phase_times"]["audio"] for x in recs if "audio" in x.get("phase_times", {})]
    assert ran, recs[0].keys()
