"""``equishard balance`` publishes a plan only when every row passed: the repeated-id check runs
on the other core while the plan is written (its hash table is not held beside the build), and
the plan is renamed into place only after it passed; a failed write is a failed run.

Bugs these catch: a plan published (or an earlier plan replaced) before the repeated-id check
finished or when it failed, a temporary file left behind, a full disk reported as a bad argument
(exit 2) or as a traceback instead of one line naming the output directory."""

from __future__ import annotations

import errno
import os

import pyarrow as pa
import pyarrow.parquet as pq

from equishard.cli import main
from tests.shards.conftest import build_inputs


def _cost(tmp_path, repeat: bool):
    _, cost, _ = build_inputs(tmp_path / "in", samples=12)
    if not repeat:
        return cost
    t = pq.read_table(cost)
    ids = t.column("sample_id").to_pylist()
    ids[-1] = ids[0]  # the first and the last rows: one id twice
    bad = t.set_column(t.schema.get_field_index("sample_id"), "sample_id", pa.array(ids))
    pq.write_table(bad.replace_schema_metadata(t.schema.metadata), tmp_path / "dup.parquet")
    return tmp_path / "dup.parquet"


def test_a_repeated_id_leaves_the_earlier_plan_in_place(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["balance", str(_cost(tmp_path, False)), "--dp", "2", "-o", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code = main(["balance", str(_cost(tmp_path, True)), "--dp", "3", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "sample_id appears more than once" in err and "dup.parquet" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing new, no temp


def test_a_failed_write_is_a_failed_run_naming_the_directory(tmp_path, capsys, monkeypatch):
    from balancing import plan_rows

    def full(self, path, rows_per_slice=plan_rows.ROWS_PER_SLICE):
        open(path, "wb").close()  # begun, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    cost = _cost(tmp_path, False)
    monkeypatch.setattr(plan_rows.PlanRows, "write", full)
    out = tmp_path / "plan"
    code = main(["balance", str(cost), "--dp", "2", "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert str(out) in err and "No space left on device while writing the plan" in err
    assert list(out.iterdir()) == []  # the begun file taken away


def test_write_plan_publishes_nothing_when_the_last_check_fails(tmp_path):
    from balancing.plan import BalanceConfig, build_plan, write_plan

    t = pq.read_table(_cost(tmp_path, False))
    result = build_plan(t, BalanceConfig(dp=2))

    def refuse():
        raise ValueError("refused at the last moment")

    out = tmp_path / "plan"
    try:
        write_plan(result, out, before_publish=refuse)
    except ValueError as exc:
        assert "last moment" in str(exc)
    else:
        raise AssertionError("write_plan published past a failed check")
    assert list(out.iterdir()) == []
    calls = []
    write_plan(result, out, before_publish=lambda: calls.append(sorted(os.listdir(out))))
    assert len(calls) == 1 and calls[0][0].startswith(".plan.parquet.tmp-")  # before the rename
    assert sorted(p.name for p in out.iterdir()) == ["plan.parquet", "report.json"]
