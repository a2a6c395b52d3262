"""The plan a write reads (``plan.parquet`` and ``report.json`` from ``equishard balance`` or a
night), checked against itself and against the cost table before anything is staged.

A plan is a file from outside like any other input. Without these checks a hand-edited or
foreign plan failed only after every shard was written (a report naming fewer ranks than the
plan uses wrote a quarter of the samples, then refused to publish), or not at all: **a plan
balanced with another cost table** (another tokenizer, template or vision policy, an older prep
of other data) was written with this table's counts, its steps even only by the other table's
numbers, and its manifest quoting a balance nobody measured. Checked here:

* ``report.json``: an object whose ``parameters`` give ``nodes`` and ``gpus_per_node`` and whose
  ``counts`` give ``out`` and ``steps``, whole numbers in range;
* ``plan.parquet``: the plan's columns, of integer types where they hold numbers, no nulls; as
  many rows as the report says; every sample once and in the cost table;
* every rank in ``0..nodes x gpus_per_node - 1``, every step in ``0..steps - 1``; a group on one
  (rank, step), at most one group on each, ``group_size`` its number of rows;
* the costs: each group's vision and LLM tokens summed from the cost table equal the plan's
  ``group_vit_tokens`` and ``group_llm_tokens``; for a table with another encoder phase (audio)
  the plan must have been balanced in it too (``group_audio_tokens``, equal likewise), and a
  plan that carries such a phase the table does not have was made from another table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from equishard.common.repeated_ids import repeated_mask
from equishard.common.values import is_count
from equishard.contracts.columns import GROUP_LLM_TOKENS, GROUP_VIT_TOKENS, LLM_TOKENS, VIT_TOKENS
from equishard.contracts.phases import ENCODER_PHASES, VISION
from equishard.contracts.plan import PLAN_PARQUET, PLAN_REPORT
from shards.errors import WriteError
from shards.store.publish import read_small

__all__ = ["read_plan"]

MAX_RANKS = 1 << 20
REPORT_LIMIT = 64 << 20  # a report lists at most 20 sample ids: kilobytes
_INT_COLUMNS = ("group_id", "step", "rank", "group_size", GROUP_VIT_TOKENS, GROUP_LLM_TOKENS)


def _report(path: Path) -> tuple[dict, int, int, int, int]:
    try:
        report = json.loads(read_small(path, REPORT_LIMIT))  # a FIFO never blocks the write
    except (OSError, ValueError, RecursionError) as exc:
        raise WriteError(f"{path}: not a readable plan report ({exc})") from None
    params = report.get("parameters") if isinstance(report, dict) else None
    counts = report.get("counts") if isinstance(report, dict) else None
    if not isinstance(params, dict) or not isinstance(counts, dict):
        raise WriteError(f"{path}: a plan report must hold 'parameters' and 'counts' objects")
    nodes, per = params.get("nodes"), params.get("gpus_per_node")
    if (
        not (is_count(nodes, 1, MAX_RANKS + 1) and is_count(per, 1, MAX_RANKS + 1))
        or nodes * per > MAX_RANKS
    ):
        raise WriteError(
            f"{path}: parameters nodes={nodes!r}, gpus_per_node={per!r} must be whole numbers "
            f">= 1 with at most {MAX_RANKS} ranks in all"
        )
    out, steps = counts.get("out"), counts.get("steps")
    if not (is_count(out, 0, 1 << 40) and is_count(steps, 0, 1 << 40)):
        raise WriteError(f"{path}: counts out={out!r}, steps={steps!r} must be whole numbers")
    return report, nodes, per, out, steps


def _columns(plan: pa.Table, path: Path) -> None:
    missing = [c for c in ("sample_id", *_INT_COLUMNS) if c not in plan.column_names]
    if missing:
        raise WriteError(f"{path}: no column(s) {missing}; is it a plan from 'equishard balance'?")
    for c in _INT_COLUMNS:
        if not pa.types.is_integer(plan.schema.field(c).type):
            raise WriteError(f"{path}: column {c} is {plan.schema.field(c).type}, not integers")
    if not pa.types.is_string(plan.schema.field("sample_id").type):
        raise WriteError(f"{path}: column sample_id is {plan.schema.field('sample_id').type}")
    for c in ("sample_id", *_INT_COLUMNS):
        if plan.column(c).null_count:
            raise WriteError(f"{path}: column {c} has {plan.column(c).null_count} null(s)")
    if "parent_step" in plan.column_names:  # a night's plan: the parent step kept, or -1
        col = plan.column("parent_step")
        low = pc.min(col).as_py() if pa.types.is_integer(col.type) and len(col) else -1
        if not pa.types.is_integer(col.type) or col.null_count or low < -1:
            raise WriteError(f"{path}: column parent_step must hold steps >= 0, or -1 (none)")


def _np(col) -> np.ndarray:
    return np.asarray(col.to_numpy(), dtype=np.int64)


def read_plan(plan_dir: str | Path, cost: pa.Table, cost_path: str) -> tuple:
    """``(plan, report, nodes, gpus_per_node, where)``: the checked plan and report, and each
    plan row's index in ``cost``; :class:`WriteError` naming the file and the first problem."""
    plan_dir = Path(plan_dir)
    rpath, ppath = plan_dir / PLAN_REPORT, plan_dir / PLAN_PARQUET
    report, nodes, per, out, steps = _report(rpath)
    try:
        plan = pq.ParquetFile(ppath).read()  # no pyarrow.dataset
    except (OSError, pa.ArrowException) as exc:
        raise WriteError(f"{ppath}: not a readable plan ({exc})") from None
    _columns(plan, ppath)
    if plan.num_rows != out:
        raise WriteError(f"{ppath}: {plan.num_rows} rows, its report ({rpath}) says {out}")
    ids = plan.column("sample_id")
    dup = repeated_mask(ids)
    if dup.any():
        first = ids[int(np.flatnonzero(dup)[0])].as_py()
        raise WriteError(f"{ppath}: sample {first!r} is planned {int(dup.sum())} times")
    where = pc.index_in(ids, value_set=cost.column("sample_id"))
    if where.null_count:
        missing = ids.filter(pc.is_null(where)).to_pylist()
        raise WriteError(
            f"{len(missing)} plan samples are not in the cost table {cost_path}, e.g. "
            f"{missing[:3]}; write with the cost table the plan was made from"
        )
    rank, step = _np(plan.column("rank")), _np(plan.column("step"))
    for name, v, hi in (("rank", rank, nodes * per), ("step", step, steps)):
        bad = np.flatnonzero((v < 0) | (v >= hi))
        if bad.size:
            raise WriteError(
                f"{ppath}: sample {ids[int(bad[0])].as_py()!r} has {name} {int(v[bad[0]])}, "
                f"outside 0..{hi - 1} (the report's {'ranks' if name == 'rank' else 'steps'})"
            )
    _check_groups(plan, cost, where, ppath, cost_path, steps)
    _check_other_phases(plan, cost, where, ppath, cost_path)
    return plan, report, nodes, per, where


def _check_other_phases(plan, cost, where, ppath: Path, cost_path: str) -> None:
    """Each encoder phase beside the vision tower (audio) in the plan exactly where it is in
    the (folded) cost table, its group loads the sums of the table's."""
    for phase in (p for p in ENCODER_PHASES if p is not VISION):
        col = f"group_{phase.tokens}"
        in_cost, in_plan = phase.tokens in cost.column_names, col in plan.column_names
        if in_cost != in_plan:
            raise WriteError(
                f"{ppath}: the plan was balanced "
                + (f"without the {phase.name} phase" if in_cost else f"with a {phase.name} phase")
                + f" but the cost table {cost_path} "
                + ("has it" if in_cost else "has none")
                + ": balance again with this cost table"
            )
        if not in_cost:
            continue
        planned = plan.column(col)
        if not pa.types.is_integer(planned.type) or planned.null_count:
            raise WriteError(f"{ppath}: column {col} must hold whole numbers, no nulls")
        t = pa.table(
            {
                "g": plan.column("group_id"),
                "p": planned.cast(pa.int64()),
                "x": cost.column(phase.tokens).take(where).cast(pa.int64()),
            }
        )
        g = t.group_by("g").aggregate([("p", "min"), ("p", "max"), ("x", "sum")])
        p_min, p_max, x_sum = (_np(g.column(c)) for c in ("p_min", "p_max", "x_sum"))
        bad = np.flatnonzero((p_min != p_max) | (p_min != x_sum))
        if bad.size:
            i = int(bad[0])
            raise WriteError(
                f"{ppath}: group {int(_np(g.column('g'))[i])} was balanced with {int(p_min[i])} "
                f"{phase.name} tokens, its samples hold {int(x_sum[i])} in {cost_path} "
                f"({bad.size} group(s) differ): the plan was made from another cost table. "
                "Balance again with this cost table, or write with the plan's own"
            )


def _check_groups(plan, cost, where, ppath: Path, cost_path: str, steps: int) -> None:
    t = pa.table(
        {
            "g": plan.column("group_id"),
            "rank": plan.column("rank").cast(pa.int64()),
            "step": plan.column("step").cast(pa.int64()),
            "size": plan.column("group_size").cast(pa.int64()),
            "pv": plan.column(GROUP_VIT_TOKENS).cast(pa.int64()),
            "pt": plan.column(GROUP_LLM_TOKENS).cast(pa.int64()),
            "v": cost.column(VIT_TOKENS).take(where).cast(pa.int64()),
            "t": cost.column(LLM_TOKENS).take(where).cast(pa.int64()),
        }
    )
    aggs = [(c, f) for c in ("rank", "step", "size", "pv", "pt") for f in ("min", "max")]
    g = t.group_by("g").aggregate([*aggs, ("v", "sum"), ("t", "sum"), ("g", "count")])
    col = {name: _np(g.column(name)) for name in g.column_names}
    gid = col["g"]
    for c in ("rank", "step", "size", "pv", "pt"):
        bad = np.flatnonzero(col[f"{c}_min"] != col[f"{c}_max"])
        if bad.size:
            raise WriteError(f"{ppath}: group {int(gid[bad[0]])} has more than one {c} value")
    bad = np.flatnonzero(col["size_min"] != col["g_count"])
    if bad.size:
        i = int(bad[0])
        raise WriteError(
            f"{ppath}: group {int(gid[i])} has group_size {int(col['size_min'][i])} but "
            f"{int(col['g_count'][i])} rows"
        )
    slot = col["rank_min"] * max(steps, 1) + col["step_min"]
    if np.unique(slot).size != slot.size:
        _, first, counts = np.unique(slot, return_index=True, return_counts=True)
        i = int(first[np.flatnonzero(counts > 1)[0]])
        raise WriteError(
            f"{ppath}: rank {int(col['rank_min'][i])} has more than one group at step "
            f"{int(col['step_min'][i])}"
        )
    bad = np.flatnonzero((col["v_sum"] != col["pv_min"]) | (col["t_sum"] != col["pt_min"]))
    if bad.size:
        i = int(bad[0])
        raise WriteError(
            f"{ppath}: group {int(gid[i])} (rank {int(col['rank_min'][i])}, step "
            f"{int(col['step_min'][i])}) was balanced with {int(col['pv_min'][i])} vision and "
            f"{int(col['pt_min'][i])} LLM tokens, its samples hold {int(col['v_sum'][i])} and "
            f"{int(col['t_sum'][i])} in {cost_path} ({bad.size} group(s) differ): the plan was "
            "made from another cost table (other data, or another tokenizer, template or vision "
            "policy). Balance again with this cost table, or write with the plan's own"
        )
