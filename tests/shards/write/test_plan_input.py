"""``write`` checks the plan it is given (``shards/write/plan_input.py``) before it stages anything:
a plan is a file from outside like any input.

The central case is rule 2 (the generation is the single source of truth): a plan balanced with
another cost table, here the same demo prepped with another tokenizer, was written with this
table's counts, its steps even only by the other table's numbers (bug: it wrote and published
silently). Reference: the group sums the plan records, recomputed from the cost table by hand.
The others are hand-edited plans, which failed only after every shard was written, or with a
KeyError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataprep import PrepConfig, read_cost_table, run_prep
from shards.errors import WriteError
from shards.write.plan_input import MAX_RANKS
from shards.write.writer import WriteConfig, write_generation


def _write(plan_dir: Path, cost: Path, out: Path):
    return write_generation(WriteConfig(plan_dir=str(plan_dir), cost_table=str(cost), out=str(out)))


def test_a_plan_balanced_with_another_cost_table_is_refused(gen_inputs, tmp_path):
    demo, cost, plan_dir = gen_inputs
    other = tmp_path / "other.parquet"
    run_prep(
        PrepConfig(
            inputs=(str(demo / "demo.jsonl"),),
            output=str(other),
            tokenizer="estimate:chars_per_token=2",
        )
    )
    # the reference: the plan's recorded group sums against the other table's, by hand
    plan = pq.read_table(plan_dir / "plan.parquet").to_pylist()
    cols = read_cost_table(other).select(["sample_id", "llm_tokens"]).to_pydict()
    llm = dict(zip(cols["sample_id"], cols["llm_tokens"], strict=True))
    sums: dict[int, int] = {}
    for r in plan:
        sums[r["group_id"]] = sums.get(r["group_id"], 0) + llm[r["sample_id"]]
    assert any(sums[r["group_id"]] != r["group_llm_tokens"] for r in plan)
    out = tmp_path / "g"
    with pytest.raises(WriteError, match="made from another cost table") as err:
        _write(plan_dir, other, out)
    assert str(other) in str(err.value)
    assert not out.exists() or not any(out.iterdir())
    # with the table the plan was made from it writes
    assert _write(plan_dir, cost, tmp_path / "ok").samples == len(plan)


def _edit_plan(plan_dir: Path, dst: Path, edit) -> Path:
    shutil.copytree(plan_dir, dst)
    t = pq.read_table(dst / "plan.parquet")
    pq.write_table(edit(t), dst / "plan.parquet")
    return dst


def _set(t: pa.Table, name: str, i: int, value) -> pa.Table:
    col = t.column(name).to_pylist()
    col[i] = value
    return t.set_column(
        t.schema.get_field_index(name), name, pa.array(col, t.schema.field(name).type)
    )


def _edit_report(plan_dir: Path, dst: Path, edit) -> Path:
    shutil.copytree(plan_dir, dst)
    rep = json.loads((dst / "report.json").read_text())
    edit(rep)
    (dst / "report.json").write_text(json.dumps(rep))
    return dst


def _last_in_group(t: pa.Table) -> int:
    """A row whose group has more than one row."""
    g = t.column("group_id").to_pylist()
    return next(i for i in range(1, len(g)) if g[i] == g[i - 1])


def _onto_row0(t: pa.Table) -> pa.Table:
    """The one row of a one-sample group moved onto row 0's (rank, step)."""
    g = t.column("group_id").to_pylist()
    i = next(i for i in range(1, len(g)) if g.count(g[i]) == 1 and g[i] != g[0])
    return _set(_set(t, "step", i, t["step"][0].as_py()), "rank", i, t["rank"][0].as_py())


def _report_of(plan_dir: Path) -> dict:
    return json.loads((plan_dir / "report.json").read_text())


def _world(plan_dir: Path) -> int:
    params = _report_of(plan_dir)["parameters"]
    return params["nodes"] * params["gpus_per_node"]


def _parent_steps(t: pa.Table, values, kind=None) -> pa.Table:
    return t.append_column("parent_step", pa.array(values, kind or pa.int64()))


def _group0_kept_at_step0(t: pa.Table) -> pa.Table:
    """Row 0's group kept from its parent's step 0, every other group new (-1)."""
    g = t.column("group_id").to_pylist()
    return _parent_steps(t, [0 if x == g[0] else -1 for x in g])


PLANS = {
    "report: fewer ranks than the plan uses": (
        lambda p, d: _edit_report(p, d, lambda r: r["parameters"].update(nodes=1, gpus_per_node=1)),
        "outside 0..0",
    ),
    "report: not JSON": (
        lambda p, d: (shutil.copytree(p, d), (d / "report.json").write_text("{"), d)[-1],
        "not a readable plan report",
    ),
    "report: no parameters": (
        lambda p, d: _edit_report(p, d, lambda r: r.pop("parameters")),
        "must hold 'parameters'",
    ),
    "report: nodes a string": (
        lambda p, d: _edit_report(p, d, lambda r: r["parameters"].update(nodes="2")),
        "whole numbers",
    ),
    "plan: a sample twice": (
        lambda p, d: _edit_report(
            _edit_plan(p, d, lambda t: pa.concat_tables([t, t.slice(0, 1)])),
            d.with_name(d.name + "-r"),
            lambda r: r["counts"].update(out=r["counts"]["out"] + 1),
        ),
        "is planned 2 times",
    ),
    "plan: a row fewer than the report": (
        lambda p, d: _edit_plan(p, d, lambda t: t.slice(0, t.num_rows - 1)),
        "rows, its report",
    ),
    "plan: a step past the report's": (
        lambda p, d: _edit_plan(p, d, lambda t: _set(t, "step", 0, 10**9)),
        "outside 0..",
    ),
    "plan: a group split over two ranks": (
        lambda p, d: _edit_plan(
            p,
            d,
            lambda t: _set(
                t, "rank", _last_in_group(t), (t["rank"][_last_in_group(t)].as_py() + 1) % 4
            ),
        ),
        "more than one rank value",
    ),
    "plan: group_size not its rows": (
        lambda p, d: _edit_plan(
            p,
            d,
            lambda t: t.set_column(
                t.schema.get_field_index("group_size"),
                "group_size",
                pa.array([7] * t.num_rows, pa.int32()),
            ),
        ),
        "group_size 7",
    ),
    "plan: two groups on one rank's step": (
        lambda p, d: _edit_plan(p, d, _onto_row0),
        "has more than one group at step",
    ),
    "plan: a rank one past the report's": (
        lambda p, d: _edit_plan(p, d, lambda t: _set(t, "rank", 0, _world(p))),
        "outside 0..",
    ),
    "plan: a step one past the report's": (
        lambda p, d: _edit_plan(
            p, d, lambda t: _set(t, "step", 0, _report_of(p)["counts"]["steps"])
        ),
        "outside 0..",
    ),
    "plan: parent steps as floats": (
        lambda p, d: _edit_plan(
            p, d, lambda t: _parent_steps(t, [-1.0] * t.num_rows, pa.float64())
        ),
        "parent_step",
    ),
    "plan: a null parent step": (
        lambda p, d: _edit_plan(p, d, lambda t: _parent_steps(t, [None] + [-1] * (t.num_rows - 1))),
        "parent_step",
    ),
    "plan: a group kept from parent step 0, no parent given": (
        lambda p, d: _edit_plan(p, d, _group0_kept_at_step0),
        "reuses groups of a parent generation; give reuse_from",
    ),
    "plan: a parent step below -1": (
        lambda p, d: _edit_plan(
            p, d, lambda t: t.append_column("parent_step", pa.array([-2] * t.num_rows, pa.int64()))
        ),
        "parent_step",
    ),
    "plan: a null step": (
        lambda p, d: _edit_plan(p, d, lambda t: _set(t, "step", 0, None)),
        "null",
    ),
    "plan: steps as floats": (
        lambda p, d: _edit_plan(
            p,
            d,
            lambda t: t.set_column(
                t.schema.get_field_index("step"), "step", t["step"].cast(pa.float64())
            ),
        ),
        "not integers",
    ),
}


@pytest.mark.parametrize("case", PLANS, ids=list(PLANS))
def test_a_malformed_plan_is_refused_before_anything_is_written(gen_inputs, tmp_path, case):
    _, cost, plan_dir = gen_inputs
    make, message = PLANS[case]
    bad = make(plan_dir, tmp_path / "plan")
    out = tmp_path / "g"
    with pytest.raises(WriteError, match=message):
        _write(bad, cost, out)
    assert not list(out.glob("*/manifest.json")) and not list(out.glob(".staging-*/node-*"))


def _with_meta(cost: Path, dst: Path, edit) -> Path:
    from equishard.contracts.cost_table import METADATA_KEY, table_metadata

    meta = table_metadata(cost)
    edit(meta)
    t = pq.read_table(cost)
    pq.write_table(t.replace_schema_metadata({METADATA_KEY: json.dumps(meta)}), dst)
    return dst


PREP_META = {
    "read_options not an object": (lambda m: m.update(read_options=["image_root"]), "read_options"),
    "read_options with a foreign key": (
        lambda m: m["read_options"].update(shell="rm -rf /"),
        "read_options",
    ),
    "check_images unknown": (lambda m: m.update(check_images="none"), "check_images"),
}


@pytest.mark.parametrize("case", PREP_META, ids=list(PREP_META))
def test_a_cost_table_whose_recorded_reading_is_not_preps_is_refused(gen_inputs, tmp_path, case):
    """Each stream's worker builds its reader from the cost table's recorded read options and
    image check: malformed ones are refused before anything is staged (bug: a TypeError in
    every worker, or an unknown check taken as no check)."""
    _, cost, plan_dir = gen_inputs
    edit, message = PREP_META[case]
    bad = _with_meta(cost, tmp_path / "cost.parquet", edit)
    out = tmp_path / "g"
    with pytest.raises(WriteError, match=message):
        _write(plan_dir, bad, out)
    assert not list(out.glob("*/manifest.json"))


def test_a_plan_keeping_a_group_its_parent_lacks_is_refused(gen_inputs, generation, tmp_path):
    """A night's plan keeps parent groups by (rank, parent step); one the parent generation
    does not have is refused naming it (bug: a KeyError from the writer's index)."""
    _, cost, plan_dir = gen_inputs
    steps = pq.read_table(plan_dir / "plan.parquet").column("step").to_pylist()
    bad = _edit_plan(
        plan_dir,
        tmp_path / "plan",
        lambda t: t.append_column("parent_step", pa.array([max(steps) + 5] * t.num_rows)),
    )
    parent = generation / (generation / "CURRENT").read_text().strip()
    cfg = WriteConfig(
        plan_dir=str(bad), cost_table=str(cost), out=str(tmp_path / "g"), reuse_from=str(parent)
    )
    with pytest.raises(WriteError, match="which has no such group"):
        write_generation(cfg)


def test_a_report_with_more_ranks_in_all_than_any_run_is_refused(gen_inputs, tmp_path):
    """nodes and gpus_per_node each within bounds, their product not: refused by the plan
    check itself (bug: a write went on to lay out two million rank streams). The check is
    called directly so that a regression fails at once instead of writing them."""
    from shards.write.plan_input import read_plan

    _, cost, plan_dir = gen_inputs
    bad = _edit_report(
        plan_dir,
        tmp_path / "plan",
        lambda r: r["parameters"].update(nodes=MAX_RANKS, gpus_per_node=2),
    )
    with pytest.raises(WriteError, match=f"at most {MAX_RANKS} ranks in all"):
        read_plan(bad, read_cost_table(cost), str(cost))
