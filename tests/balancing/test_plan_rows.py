"""A plan's rows made from its groups (``balancing.plan_rows``): the table made at once and the
file written a slice at a time hold the same rows, values and types as the groups say, for slices
that end exactly at the last row, one before it and one after, and the CLI's largest-group value
is read from the groups without making the table.

Bugs these catch: a slice that skips or repeats the row at its boundary, a group value taken from
the wrong group, a file whose encodings or schema differ from the in-memory plan's, a largest
value taken over groups that hold no rows (dissolved groups and empty last-step slots)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from balancing.plan import BalanceConfig, BalanceResult, build_plan, write_plan
from balancing.plan_rows import PlanRows
from tests.shards.conftest import build_inputs


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> BalanceResult:
    _, cost, _ = build_inputs(tmp_path_factory.mktemp("rows"), samples=40)
    return build_plan(pq.read_table(cost), BalanceConfig(dp=3, target_batch=2.0))


def _reference(rows: PlanRows) -> pa.Table:
    """The plan row by row from the groups, in Python."""
    by_name = {f.name: [] for f in rows.schema}
    ids = rows.sample_ids.to_pylist()
    flags = ["isf", "leftover", "oversize", "last-step"]
    for i, g in enumerate(rows.group_of_row.tolist()):
        by_name["sample_id"].append(ids[i])
        by_name["group_id"].append(g)
        for k, x in rows.per_group.items():
            v = x[g].item()
            by_name[k].append(flags[v] if k == "group_flag" else v)
    return pa.table(by_name, schema=rows.schema)


def test_the_table_made_at_once_is_the_groups_row_by_row(result):
    from balancing.isf import FLAG_NAMES

    assert list(FLAG_NAMES) == ["isf", "leftover", "oversize", "last-step"]
    assert result.rows.table().equals(_reference(result.rows))
    assert result.plan.num_rows == 40 == result.report["counts"]["out"]


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_written_a_slice_at_a_time_the_file_is_the_table(result, tmp_path, delta):
    rows = result.rows
    n = rows.num_rows
    for per in (max(1, n // 3 + delta), n + delta):  # several slices; one ending at the last row
        path = tmp_path / f"plan-{per}.parquet"
        rows.write(path, rows_per_slice=per)
        got = pq.read_table(path)
        assert got.equals(rows.table()) and got.schema == rows.schema
        meta = pq.ParquetFile(path).metadata
        assert meta.num_row_groups == -(-n // per)  # one row group a slice, none empty
        assert sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == n


def test_a_slice_size_below_one_is_refused(result, tmp_path):
    with pytest.raises(ValueError, match="rows_per_slice must be at least 1, not 0"):
        result.rows.write(tmp_path / "p.parquet", rows_per_slice=0)


def test_write_plan_writes_the_same_file_either_way(result, tmp_path):
    """From the rows (sliced) and from a made table (at once): the same table, dictionaries on
    the same columns."""
    write_plan(result, tmp_path / "rows")
    made = BalanceResult(plan=result.rows.table(), report=result.report)
    write_plan(made, tmp_path / "table")
    a = pq.read_table(tmp_path / "rows" / "plan.parquet")
    b = pq.read_table(tmp_path / "table" / "plan.parquet")
    assert a.equals(b)
    col = pq.ParquetFile(tmp_path / "rows" / "plan.parquet").metadata.row_group(0).column
    encodings = {col(i).path_in_schema: col(i).encodings for i in range(len(a.schema))}
    assert "RLE_DICTIONARY" in encodings["rank"] and "RLE_DICTIONARY" not in encodings["step"]


def test_the_largest_group_value_counts_only_groups_with_rows():
    per_group = {
        "step": np.array([0, 0, 1]),
        "group_flag": np.zeros(3, np.int8),
        "group_llm_tokens": np.array([5, 900, 7]),  # group 1 holds no row
    }
    schema = pa.schema(
        [
            ("sample_id", pa.string()),
            ("group_id", pa.int64()),
            ("step", pa.int64()),
            ("group_flag", pa.string()),
            ("group_llm_tokens", pa.int64()),
        ]
    )
    rows = PlanRows(pa.array(["a", "b", "c"]), np.array([0, 2, 2]), per_group, schema)
    assert rows.column_max("group_llm_tokens") == 7
    result = BalanceResult(rows=rows, report={})
    assert result.column_max("group_llm_tokens") == 7
    made = BalanceResult(plan=rows.table(), report={})
    assert made.column_max("group_llm_tokens") == 7
    empty = PlanRows(pa.array([], pa.string()), np.zeros(0, np.int64), per_group, schema)
    assert empty.column_max("group_llm_tokens") is None


def test_rows_and_ids_must_agree_and_a_result_takes_one_plan():
    with pytest.raises(ValueError, match="2 sample ids for 3 rows"):
        PlanRows(pa.array(["a", "b"]), np.zeros(3, np.int64), {}, pa.schema([]))
    with pytest.raises(ValueError, match="its plan or its rows, one of them"):
        BalanceResult(report={})
