"""Incremental plans: kept steps are the parent's, everything else is re-planned, nothing lost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancing.cost_model import CostModel
from balancing.incremental import incremental_plan
from balancing.plan import BalanceConfig, build_plan
from equishard.contracts.cost_table import COST_SCHEMA


def _table(n: int, seed: int, prefix: str = "s") -> pa.Table:
    rng = np.random.default_rng(seed)
    tiles = rng.integers(0, 7, n)
    text = rng.integers(50, 2000, n)
    seq = [[1024] * int(k) for k in tiles]
    return pa.table(
        {
            "sample_id": [f"{prefix}{i}" for i in range(n)],
            "source": ["t"] * n,
            "num_images": pa.array(np.minimum(tiles, 1), pa.int32()),
            "vit_tokens": pa.array(tiles * 1024, pa.int64()),
            "vit_seq_lens": pa.array(seq, pa.list_(pa.int32())),
            "llm_tokens": pa.array(text + 256 * tiles, pa.int64()),
            "text_tokens": pa.array(text, pa.int64()),
            "modality": ["image"] * n,
            "image_widths": pa.array([[]] * n, pa.list_(pa.int32())),
            "image_heights": pa.array([[]] * n, pa.list_(pa.int32())),
            "location": [""] * n,
            "fingerprint": [f"f{i}" for i in range(n)],
            "cache_key": [""] * n,
        },
        schema=COST_SCHEMA,
    )


CFG = BalanceConfig(dp=4, nodes=2, target_batch=3)


def _steps(plan: pa.Table) -> dict[int, list]:
    out: dict[int, list] = {}
    cols = plan.select(["step", "rank", "sample_id"]).to_pydict()
    for s, r, i in zip(cols["step"], cols["rank"], cols["sample_id"], strict=True):
        out.setdefault(s, []).append((r, i))
    return out


@settings(max_examples=15, deadline=None)
@given(st.integers(60, 300), st.integers(0, 80), st.integers(0, 15), st.integers(0, 10_000))
def test_every_sample_once_and_kept_steps_unchanged(n_old, n_new, n_del, seed):
    old = _table(n_old, seed)
    parent = build_plan(old, CFG).plan
    rng = np.random.default_rng(seed)
    deleted = {f"s{i}" for i in rng.choice(n_old, size=min(n_del, n_old - 1), replace=False)}
    keep = old.filter(
        pc.invert(pc.is_in(old.column("sample_id"), pa.array(sorted(deleted), pa.string())))
    )
    cost = pa.concat_tables([keep, _table(n_new, seed + 1, "new")]) if n_new else keep
    res = incremental_plan(parent, cost, deleted, CFG)
    plan = res.plan
    ids = plan.column("sample_id").to_pylist()
    assert sorted(ids) == sorted(cost.column("sample_id").to_pylist())  # partition of the table
    steps = plan.column("step").to_numpy()
    assert np.all(np.diff(steps) >= 0) and set(steps.tolist()) == set(range(steps.max() + 1))
    # a kept step holds exactly the parent step's groups on the same ranks
    parent_steps = _steps(parent)
    ps = plan.column("parent_step").to_numpy()
    for s, members in _steps(plan).items():
        olds = set(ps[steps == s].tolist())
        assert len(olds) == 1
        (o,) = olds
        if o >= 0:
            assert sorted(members) == sorted(parent_steps[o])
            assert not {i for _, i in members} & deleted
    assert res.report["counts"]["in"] == res.report["counts"]["out"] == cost.num_rows
    inc = res.report["incremental"]
    assert inc["kept_samples"] + inc["pool_samples"] == cost.num_rows


def test_nothing_changed_keeps_every_full_regular_step():
    old = _table(400, 3)
    parent = build_plan(old, CFG).plan
    res = incremental_plan(parent, old, set(), CFG)
    flags = np.array(parent.column("group_flag").to_pylist())
    pst = parent.column("step").to_numpy()
    rebuild = set(pst[np.isin(flags, ["leftover", "last-step"])].tolist())
    assert res.report["incremental"]["kept_steps"] == len(set(pst.tolist()) - rebuild)
    assert res.report["incremental"]["rebuilt_parent_steps"] == len(rebuild)
    # why each was rebuilt, by a loop over the parent's rows: a step holding a row of the short
    # last step is that; any other rebuilt step holds an ISF leftover group
    last = {s for s, f in zip(pst.tolist(), flags.tolist(), strict=True) if f == "last-step"}
    want = {"short last step": len(last), "ISF leftover group": len(rebuild - last)}
    assert last and rebuild - last  # both kinds occur in this parent
    assert res.report["incremental"]["rebuilt_because"] == want


def test_a_different_layout_rebuilds_everything():
    old = _table(200, 5)
    parent = build_plan(old, BalanceConfig(dp=2, nodes=1, target_batch=3)).plan
    res = incremental_plan(parent, old, set(), CFG)
    assert res.report["incremental"]["full_rebuild"]
    assert res.report["incremental"]["kept_steps"] == 0


_CONFIGS = [
    {"dp": 4, "nodes": 2, "target_batch": 3},
    {"dp": 6, "gpus_per_node": 3, "target_batch": 2.5, "seed": 7, "rounds": 3, "slack": 0.2},
    {"dp": 2, "q_v": 6000, "q_t": 5000, "rounds": 25, "slack": 0.0, "seed": 11},
    {
        "dp": 8,
        "nodes": 4,
        "target_batch": 5,
        "cost_model": CostModel.from_dims(vit_hidden=64, vit_layers=2, llm_hidden=96, llm_layers=3),
    },
]


@pytest.mark.parametrize("kw", _CONFIGS)
def test_the_report_records_the_configuration_a_night_rebuilds(kw):
    """A night balances its samples with the parent's configuration, rebuilt from the plan
    report the parent's manifest carries (BalanceConfig.from_report). The anchor is the
    configuration itself: what the report records must rebuild it field for field (bug: the
    night used the default rounds, slack and automatic q_v/q_t whatever the parent used)."""
    cfg = BalanceConfig(**kw)
    report = build_plan(_table(200, 3), cfg).report
    again = BalanceConfig.from_report(report["parameters"], "report.json")
    nodes, per = cfg.topology
    assert again == replace(cfg, nodes=nodes, gpus_per_node=per)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda p: p.pop("dp"), r"\['dp'\]"),
        (lambda p: p.update(seed=1.5), r"\['seed'\]"),
        (lambda p: p.update(target_batch="4"), "target_batch"),
        (lambda p: p["isf"].update(rounds=True), "rounds"),
        (lambda p: p["isf"].update(auto=False, q_v=None), "isf.q_v"),
        (lambda p: p.update(cost_model={"vision": [], "llm": {}, "source": ""}), "cost model"),
        (lambda p: p["cost_model"]["llm"].update(alpha=float("nan")), "cost model"),
        (lambda p: p.update(dp=3), "--dp is 3"),
    ],
)
def test_a_recorded_configuration_that_is_not_one_is_refused_naming_it(edit, match):
    params = build_plan(_table(60, 1), BalanceConfig(dp=4, nodes=2)).report["parameters"]
    edit(params)
    with pytest.raises(ValueError, match=match):
        BalanceConfig.from_report(params, "report.json")


def test_a_parent_plan_keeping_a_sample_its_table_lacks_is_refused():
    """The parent's plan and cost table come from outside (a generation's carried files): a
    plan that keeps a sample the table does not hold was an assert (gone under python -O, and
    then a plan row without a cost row)."""
    old = _table(200, 4)
    parent = build_plan(old, CFG).plan
    cost = old.filter(pc.not_equal(old.column("sample_id"), "s7"))  # not deleted: just absent
    with pytest.raises(ValueError, match=r"does not hold, e\.g\. \['s7'\]"):
        incremental_plan(parent, cost, set(), CFG)


def test_steps_stay_numbered_in_order_when_early_steps_vanish():
    """Every sample of the parent's first half of steps is deleted: the kept steps' numbers are
    then past the night's step count, so they must be renumbered (bug: kept at their parent
    numbers, the plan's steps had holes and the fresh short step could land before kept ones).
    Reference: steps 0..N-1 each present, and only the last one may have ranks without a group."""
    old = _table(300, 9)
    parent = build_plan(old, CFG).plan
    steps = parent.column("step").to_numpy()
    ids = parent.column("sample_id").to_pylist()
    gone = {i for i, s in zip(ids, steps.tolist(), strict=True) if s < steps.max() // 2}
    keep = pc.invert(pc.is_in(old.column("sample_id"), pa.array(sorted(gone), pa.string())))
    res = incremental_plan(parent, old.filter(keep), gone, CFG)
    st = res.plan.column("step").to_numpy()
    assert set(st.tolist()) == set(range(int(st.max()) + 1))
    ranks = res.plan.group_by("step").aggregate([("rank", "count_distinct")]).to_pydict()
    short = [
        s for s, n in zip(ranks["step"], ranks["rank_count_distinct"], strict=True) if n < CFG.dp
    ]
    assert short in ([], [int(st.max())])
    assert res.report["incremental"]["kept_steps"] > 0


def _short_only_last(plan: pa.Table, dp: int) -> list[int]:
    """The steps with ranks left without a group (the reference: at most the last one)."""
    ranks = plan.group_by("step").aggregate([("rank", "count_distinct")]).to_pydict()
    return sorted(
        s for s, n in zip(ranks["step"], ranks["rank_count_distinct"], strict=True) if n < dp
    )


def test_a_fresh_short_step_stays_last_when_kept_steps_reach_the_end():
    """One early step's samples are deleted: the night keeps the later full steps, and when the
    last kept one already holds the night's final step number, the fresh short step cannot take
    its place there (bug: kept steps kept their numbers and the short step filled a hole in the
    middle, a step with idle ranks inside the epoch). Over 40 parents, whatever the numbering:
    steps 0..N-1 each present, only the last may be short, every sample once."""
    hit = 0
    for seed in range(40):
        old = _table(300, seed)
        parent = build_plan(old, CFG).plan
        steps, ids = parent.column("step").to_pylist(), parent.column("sample_id").to_pylist()
        gone = {i for i, s in zip(ids, steps, strict=True) if s == 1}
        keep = pc.invert(pc.is_in(old.column("sample_id"), pa.array(sorted(gone), pa.string())))
        res = incremental_plan(parent, old.filter(keep), gone, CFG)
        st = res.plan.column("step").to_numpy()
        assert set(st.tolist()) == set(range(int(st.max()) + 1)), seed
        assert _short_only_last(res.plan, CFG.dp) in ([], [int(st.max())]), seed
        assert sorted(res.plan.column("sample_id").to_pylist()) == sorted(set(ids) - gone)
        ps = res.plan.column("parent_step").to_numpy()
        hit += bool(_short_only_last(res.plan, CFG.dp)) and int(ps[st == st.max() - 1][0]) >= 0
    assert hit  # some night had a kept step right before its fresh short last step
