"""Training on a real generation over gloo: redistribution changes where samples are computed,
never the result; DP x PP trains; every sample of the steps is seen once."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks


def _samples_for(rank, manifest, collate):
    """Rank r's first group; rank 0 also takes rank 3's and both their second ones, so rank 0
    is heavy and rank 3 arrives empty."""
    from shards import read_group

    index = manifest.group_index()

    def group(r, step=0):
        shard, g = index[(r, step)]
        return read_group(manifest.path, shard, g)[0]

    if rank == 3:
        return collate([])
    if rank == 0:
        return collate(group(0) + group(3) + group(0, 1) + group(3, 1))
    return collate(group(rank))


def _invariance(rank, world, gen):
    from shards import open_generation
    from trainer_adapter import TrainConfig, Trainer, VLMConfig
    from trainer_adapter.train.loop import build_collator

    cfg = TrainConfig(shards=gen, dp=world, pp=1, steps=1, method="lpt")
    manifest = open_generation(gen)
    collate = build_collator(cfg, manifest)
    batch = _samples_for(rank, manifest, collate)
    mcfg = VLMConfig.preset("tiny", vocab_size=collate.vocab_size, patch_dim=588, merge=2)
    trainer = Trainer(cfg, mcfg, mb_tokens=0, ranks_per_node=2)
    on = trainer.forward_backward(batch)
    g_on = [p.grad.clone() for p in trainer.params]
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.set_redistribution(False)
    off = trainer.forward_backward(batch)
    g_off = [p.grad.clone() for p in trainer.params]
    diff = max(float((a - b).abs().max()) for a, b in zip(g_on, g_off, strict=True))
    scale = max(float(g.abs().max()) for g in g_off)
    # the model FLOPs of this rank's own samples (nothing moved): the LM head at the positions
    # with a next-token target only (a label, not a sample's first token)
    from trainer_adapter.train.flops import training_flops

    lens = batch["llm_lens"].tolist()
    cu = batch["cu_seqlens"].tolist()
    labels = batch["labels"]
    pairs = itertools.pairwise(cu)
    targets = sum(int((labels[a + 1 : b] != -100).sum()) for a, b in pairs if b > a)
    units = batch["units_hw"].prod(dim=1).tolist() if batch["units_hw"].numel() else []
    return {
        "flops": (on["model_flops"], off["model_flops"]),
        "own_flops": training_flops(mcfg, lens, units, targets=targets),
        "every_token_flops": training_flops(mcfg, lens, units),
        "loss": (on["loss"], off["loss"]),
        "diff": diff,
        "scale": scale,
        "on": on["route"],
        "off": off["route"],
        "n": len(batch["sample_ids"]),
    }


def test_redistribution_gives_the_same_loss_and_gradients(train_generation):
    got = run_ranks(_invariance, 4, str(train_generation), timeout=300)
    assert got[3]["n"] == 0 and got[0]["n"] > got[1]["n"]  # uneven, one rank empty
    on, off = got[0]["loss"]
    assert on == pytest.approx(off, rel=1e-5)
    # model FLOPs: each rank's own samples' with nothing moved (the LM head at the target
    # positions only, not every token); the same total after the moves
    for g in got:
        assert g["flops"][1] == pytest.approx(g["own_flops"], rel=1e-12)
    assert sum(g["flops"][0] for g in got) == pytest.approx(sum(g["flops"][1] for g in got))
    assert got[0]["every_token_flops"] > got[0]["own_flops"]
    for g in got:
        assert g["loss"] == got[0]["loss"]  # the loss is all-reduced: every rank agrees
        assert g["scale"] > 0
        assert g["diff"] <= 1e-5 * g["scale"] + 1e-7, g
    route = got[0]["on"]
    moved = sum(v["intra_node"] + v["inter_node"] for v in route["bytes"].values())
    assert moved > 0  # samples really moved
    assert route["bytes"]["tokens"]["intra_node"] + route["bytes"]["tokens"]["inter_node"] > 0
    assert route["llm_after_max_over_mean"] < route["llm_before_max_over_mean"]
    assert route["vision_after_max_over_mean"] < route["vision_before_max_over_mean"]
    # the baseline moved nothing and measured what balancing made of the same step (a dry run)
    off = got[0]["off"]
    assert all(v["intra_node"] + v["inter_node"] == 0 for v in off["bytes"].values())
    for phase in ("vision", "llm"):
        assert off["methods"][phase].startswith("dry run")
        assert off[f"{phase}_before_max_over_mean"] == route[f"{phase}_before_max_over_mean"]
        assert off[f"{phase}_after_max_over_mean"] == off[f"{phase}_before_max_over_mean"]
        assert off[f"{phase}_planned_max_over_mean"] == pytest.approx(
            route[f"{phase}_after_max_over_mean"]
        )


def _train(rank, world, cfg_kw, log):
    from trainer_adapter import TrainConfig
    from trainer_adapter.train.loop import run

    recs = run(TrainConfig(**cfg_kw, log=log))
    return recs


# make test: 1F1B (the default); GPipe's run in make test-slow (CI)
@pytest.mark.parametrize("schedule", ["1f1b", pytest.param("gpipe", marks=pytest.mark.slow)])
def test_dp2_pp2_trains_and_sees_every_sample_once(train_generation, tmp_path, schedule):
    from shards import open_generation

    steps = 6
    log = tmp_path / "train.jsonl"
    cfg = {
        "shards": str(train_generation),
        "dp": 2,
        "pp": 2,
        "steps": steps,
        "schedule": schedule,
        "workers": 0,
        "lr": 3e-3,
        "microbatches": 2,
    }
    recs = run_ranks(_train, 4, cfg, str(log), timeout=480)[0]
    assert len(recs) == steps
    losses = [r["loss"] for r in recs]
    assert np.mean(losses[-2:]) < np.mean(losses[:2])  # it learns
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(steps))
    ids = [i for r in recs for v in r["samples"].values() for i in v]
    assert len(ids) == len(set(ids))  # within the epoch, nothing twice
    m = open_generation(train_generation)
    plan_slots = m.steps * m.dp
    assert len(ids) == m.totals["samples"] if steps * 2 >= plan_slots else len(ids) > 0
    for r in recs:
        assert set(r["bubble_per_stage"]) == {"0", "1"} or set(r["bubble_per_stage"]) == {0, 1}
        assert r["tokens_per_second"] > 0
        # the partition timed the head at the generation's targets (image tokens have none)
        assert 0 < r["partition_target_share"] < 1
        lm = r["loads_max_over_mean"]
        assert lm["llm_after"] <= lm["llm_before"] + 1e-9


def test_interleaved_schedule_runs(train_generation, tmp_path):
    cfg = {
        "shards": str(train_generation),
        "dp": 1,
        "pp": 2,
        "steps": 2,
        "schedule": "interleaved1f1b",
        "workers": 0,
        "microbatches": 2,
        "virtual_stages": 2,
    }
    recs = run_ranks(_train, 2, cfg, None, timeout=480)[0]
    assert len(recs) == 2 and all(np.isfinite(r["loss"]) for r in recs)


def test_train_config_rejects_bad_settings():
    from trainer_adapter import TrainConfig

    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(shards="x", dp=1, schedule="zb")
    with pytest.raises(ValueError, match="divisible"):
        TrainConfig(shards="x", dp=1, pp=2, schedule="interleaved1f1b", microbatches=3)
    with pytest.raises(ValueError, match="dp must be"):
        TrainConfig(shards="x", dp=0)


def test_empty_rank_batch_is_well_formed():
    from trainer_adapter.train.trainer import empty_batch

    b = empty_batch(12, 7)
    assert b["input_ids"].numel() == 0 and b["patches"].shape == (0, 12)
    assert b["cu_seqlens"].tolist() == [0] and torch.is_tensor(b["units_hw"])


def test_pipelined_loss_equals_the_unpipelined_one(train_generation):
    """Packing into fixed-shape microbatches, 1F1B ordering and labels on the last stage change
    nothing about the first step's loss (same init, same data); nor does redistribution, which
    the unpipelined run leaves off (the baseline: a dry run that logs what it would have given)."""
    base = {"shards": str(train_generation), "dp": 2, "steps": 1, "workers": 0}
    flat = run_ranks(_train, 2, {**base, "pp": 1, "redistribute": False}, None, timeout=300)[0]
    piped = run_ranks(_train, 4, {**base, "pp": 2, "microbatches": 4}, None, timeout=300)[0]
    assert piped[0]["loss"] == pytest.approx(flat[0]["loss"], rel=1e-5)
    lm = flat[0]["loads_max_over_mean"]
    assert flat[0]["methods"]["llm"].startswith("dry run") and flat[0]["bytes_inter_node"] == 0
    assert lm["llm_after"] == lm["llm_before"] and lm["llm_planned"] <= lm["llm_before"]
    assert not piped[0]["methods"]["llm"].startswith("dry run")


def test_a_different_tokenizer_than_prep_is_refused(train_generation, tmp_path):
    from shards import open_generation
    from trainer_adapter import TrainConfig
    from trainer_adapter.train.loop import build_collator

    m = open_generation(train_generation)
    tok = json.loads(Path(m.raw["prep"]["tokenizer"]["path"]).read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps(tok, indent=1))  # same content, other bytes: another sha256
    with pytest.raises(ValueError, match="not the one the generation was measured with"):
        build_collator(TrainConfig(shards=str(train_generation), dp=1, tokenizer=str(other)), m)
    assert build_collator(TrainConfig(shards=str(train_generation), dp=1), m).vocab_size > 0


@pytest.mark.parametrize(
    "longest,rows",
    [(None, 32768), (0, 32768), (32768, 32768), (32769, 32769), (1 << 22, 1 << 22)],
)
def test_the_position_table_holds_the_generations_longest_sample(longest, rows):
    """Bug class: a fixed table (32768 positions) failed mid-run at the step that held a longer
    sample; the table is sized from the manifest's ``loads`` at the start."""
    from types import SimpleNamespace

    from trainer_adapter.train.loop import position_table_size

    loads = None if longest is None else {"max_sample_llm_tokens": longest}
    assert position_table_size(SimpleNamespace(raw={"loads": loads}, path="g")) == rows


def test_a_sample_past_the_largest_position_table_is_refused_at_the_start():
    from types import SimpleNamespace

    from trainer_adapter.train.loop import MAX_POSITIONS, position_table_size

    m = SimpleNamespace(raw={"loads": {"max_sample_llm_tokens": MAX_POSITIONS + 1}}, path="g/m")
    with pytest.raises(ValueError, match=r"g/m: the generation's longest sample has 4194305"):
        position_table_size(m)
