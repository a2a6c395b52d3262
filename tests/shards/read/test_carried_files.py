"""The files a generation carries beside its shards (``cost.parquet``, ``plan.parquet``) are
used only as written: ``equishard report`` reads them checked, ``equishard verify`` checks them.

Bugs these catch: the report read ``plan.parquet`` and ``cost.parquet`` as found (neither was
checked against the sha256 the manifest records, locally or in an object store), so an edited
plan drew heatmaps of other steps, or, with a step of 10^12, sized them past memory; a plan
holding a sample the cost table lacks failed with a bare KeyError; ``verify`` said OK for a
generation whose plan had been edited (a night then refused it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shards.read.report import render_report, step_loads
from shards.read.verify import verify_generation
from shards.store.manifest import ManifestError, open_generation


def _gen_dir(root):
    return open_generation(root).path


def test_a_plan_edited_after_the_write_is_refused(gen_copy, tmp_path):
    plan_path = f"{_gen_dir(gen_copy)}/plan.parquet"
    plan = pq.read_table(plan_path)
    huge = pc.add(plan["step"], pa.scalar(10**12, plan["step"].type))
    pq.write_table(plan.set_column(plan.schema.get_field_index("step"), "step", huge), plan_path)
    with pytest.raises(ManifestError, match=r"plan\.parquet.*changed after it was written"):
        render_report(gen_copy, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_a_cost_table_changed_in_place_is_refused(gen_copy, tmp_path):
    cost_path = Path(_gen_dir(gen_copy)) / "cost.parquet"
    data = bytearray(cost_path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size, other bytes
    cost_path.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"cost\.parquet: sha256"):
        render_report(gen_copy, tmp_path / "r.html")


def test_the_report_of_an_intact_generation_is_written(generation, tmp_path):
    out = render_report(generation, tmp_path / "r.html")
    assert out.read_text().count("data:image/png;base64,") >= 4


def _tables(generation):
    m = open_generation(generation)
    return (
        pq.read_table(f"{m.path}/plan.parquet"),
        pq.read_table(f"{m.path}/cost.parquet"),
        m.dp,
        m.steps,
    )


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("step", 10**12, "steps outside"),
        ("step", -1, "steps outside"),
        ("rank", 64, "ranks outside"),
    ],
)
def test_step_loads_refuses_a_plan_outside_the_layout(generation, column, value, message):
    plan, cost, d, steps = _tables(generation)
    col = plan[column].to_numpy().copy()
    col[0] = value
    bad = plan.set_column(plan.schema.get_field_index(column), column, pa.array(col))
    with pytest.raises(ValueError, match=message):
        step_loads(bad, cost, d, steps)


def test_step_loads_refuses_a_sample_the_cost_table_lacks(generation):
    plan, cost, d, steps = _tables(generation)
    ids = plan["sample_id"].to_pylist()
    ids[0] = "not-in-the-table"
    bad = plan.set_column(plan.schema.get_field_index("sample_id"), "sample_id", pa.array(ids))
    with pytest.raises(ValueError, match="not-in-the-table"):
        step_loads(bad, cost, d, steps)


def test_step_loads_sums_each_ranks_samples(generation):
    """Anchor: each (step, rank) load equals the sum over the plan's rows, summed by hand."""
    plan, cost, d, steps = _tables(generation)
    loads = step_loads(plan, cost, d, steps)
    llm = dict(zip(cost["sample_id"].to_pylist(), cost["llm_tokens"].to_pylist(), strict=True))
    want = np.zeros((steps, d))
    for sid, s, r in zip(
        *(plan[c].to_pylist() for c in ("sample_id", "step", "rank")), strict=True
    ):
        want[s, r] += llm[sid]
    assert np.array_equal(loads["llm_after"], want)
    assert loads["llm_before"].sum() <= sum(llm.values())


@pytest.mark.parametrize("fast", [False, True])
def test_verify_checks_the_carried_files(gen_copy, fast):
    assert verify_generation(gen_copy, deep=not fast).ok
    gen = Path(_gen_dir(gen_copy))
    plan = gen / "plan.parquet"
    data = bytearray(plan.read_bytes())
    data[len(data) // 2] ^= 0xFF
    plan.write_bytes(bytes(data))
    (gen / "cost.parquet").unlink()
    r = verify_generation(gen_copy, deep=not fast)
    assert not r.ok
    assert any("plan.parquet: sha256" in p for p in r.problems), r.problems
    assert any("cost.parquet: missing" in p for p in r.problems), r.problems
