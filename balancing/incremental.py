"""Incremental balancing for nightly runs: keep the parent's balanced steps, rebuild the rest.

A step of the parent plan is **kept as it was** (same groups, same (node, rank) placement) when
it is a full step whose groups are all regular ISF or oversize groups and none of its samples
was deleted or updated. Every other step is **dissolved**: the short last step (its groups were
packed from what was left), steps holding an ISF leftover group (packed best-fit, the least even
ones), and steps that lost or changed a sample. Their samples join the new and updated samples
in a pool that is grouped with ISF, assigned to steps and placed on (node, rank) like a fresh
plan; those steps follow the kept ones, the new short last step (if any) last.

Every step stays balanced: a kept step is exactly a step the parent plan balanced (its D groups
were chosen to be alike), and every rebuilt step is balanced by the same algorithm over the pool.
Steps need not be alike *across* steps (ranks only wait for each other within a step), and the
loader reshuffles step order every epoch, so old and new steps mix. The plan gains a
``parent_step`` column (-1 for rebuilt groups) so the writer can copy kept groups from the
parent's shards instead of reading the raw data again.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from balancing.loads import SampleLoads, cost_key, sample_loads
from balancing.plan import PLAN_SCHEMA, BalanceConfig, BalanceResult, build_plan
from balancing.plan_quality import (
    group_stats,
    pad_ratios,
    plan_quality,
    random_batching_metrics,
)
from equishard.contracts.plan import INCREMENTAL_PLAN_SCHEMA, plan_schema

__all__ = ["INCREMENTAL_PLAN_SCHEMA", "incremental_plan"]

_REBUILD_FLAGS = ("leftover", "last-step")


def _dissolved_steps(parent: pa.Table, changed: set[str]) -> dict[int, str]:
    """Parent steps to rebuild, with the reason."""
    steps = parent.column("step").to_numpy()
    flags = np.asarray(parent.column("group_flag").to_pylist(), dtype=object)
    ids = parent.column("sample_id").to_pylist()
    out: dict[int, str] = {}
    for s in np.unique(steps[np.isin(flags, _REBUILD_FLAGS)]).tolist():
        last = flags[steps == s]
        out[int(s)] = "short last step" if "last-step" in last else "ISF leftover group"
    hit = np.fromiter((i in changed for i in ids), dtype=bool, count=len(ids))
    for s in np.unique(steps[hit]).tolist():
        out.setdefault(int(s), "sample deleted or updated")
    return out


def incremental_plan(
    parent: pa.Table,
    cost: pa.Table,
    changed: set[str],
    cfg: BalanceConfig,
    *,
    replan: bool = False,
) -> BalanceResult:
    """Plan ``cost`` (the new night's full cost table) keeping what of ``parent`` still holds.

    ``changed`` are the sample ids deleted or updated since the parent; samples of ``cost`` that
    the parent does not have are new. ``replan``: the cost model changed (a calibration), so
    every parent step is rebuilt.
    """
    t0 = time.perf_counter()
    sl = sample_loads(cost, cfg.cost_model, "the night's cost table")
    cost = sl.table  # video frames the vision tower runs folded into its load
    nodes, per = cfg.topology
    d = nodes * per
    parent_d = int(pc.max(parent.column("rank")).as_py()) + 1 if parent.num_rows else d
    dissolved = _dissolved_steps(parent, changed) if parent_d == d else {}
    if replan:  # kept steps were even for the old costs only
        for s in np.unique(parent.column("step").to_numpy()).tolist():
            dissolved.setdefault(int(s), "cost model changed")
    p_steps = parent.column("step").to_numpy()
    live = set(cost.column("sample_id").to_pylist())
    keep_mask = (
        ~np.isin(p_steps, list(dissolved)) if parent_d == d else np.zeros(len(p_steps), bool)
    )
    kept = parent.filter(pa.array(keep_mask)).select(PLAN_SCHEMA.names)
    kept_ids = kept.column("sample_id").to_pylist()
    lost = [i for i in kept_ids if i not in live]
    if lost:  # the parent's plan and cost table disagree (neither is this night's to trust)
        raise ValueError(
            f"the parent plan keeps {len(lost)} sample(s) its cost table does not hold, e.g. "
            f"{lost[:3]}: the parent's plan and cost table are not one generation's"
        )
    old_steps = np.unique(kept.column("step").to_numpy())
    kept_set = set(kept_ids)
    pool = cost.filter(pa.array([i not in kept_set for i in cost.column("sample_id").to_pylist()]))
    fresh = build_plan(pool, cfg) if pool.num_rows else None
    kept_map, new_map = _step_numbers(old_steps, fresh)
    parts = [
        kept.set_column(
            kept.schema.get_field_index("step"),
            "step",
            pa.array(kept_map[kept.column("step").to_numpy()], pa.int64()),
        ).append_column("parent_step", kept.column("step"))
    ]
    if fresh is not None:
        gid0 = int(pc.max(kept.column("group_id")).as_py()) + 1 if kept.num_rows else 0
        fp = fresh.plan
        fp = fp.set_column(
            fp.schema.get_field_index("step"),
            "step",
            pa.array(new_map[fp.column("step").to_numpy()], pa.int64()),
        )
        fp = fp.set_column(
            fp.schema.get_field_index("group_id"), "group_id", pc.add(fp.column("group_id"), gid0)
        )
        parts.append(fp.append_column("parent_step", pa.array(np.full(fp.num_rows, -1))))
    # steps in order, ranks in order, a group's samples in their order (the sort is stable)
    base = INCREMENTAL_PLAN_SCHEMA
    plan = pa.concat_tables([p.select(base.names).cast(base) for p in parts]).sort_by(
        [("step", "ascending"), ("rank", "ascending")]
    )
    rows = _rows_of(plan, cost)
    plan = _with_phase_columns(plan, sl, rows)
    n_steps = old_steps.size + (fresh.report["counts"]["steps"] if fresh else 0)
    report = _report(plan, sl, rows, cfg, d, nodes, fresh, n_steps)
    report["incremental"] = {
        "kept_steps": int(old_steps.size),
        "rebuilt_parent_steps": len(dissolved),
        "rebuilt_because": {
            why: sum(1 for r in dissolved.values() if r == why) for why in set(dissolved.values())
        },
        "new_steps": n_steps - int(old_steps.size),
        "kept_samples": kept.num_rows,
        "pool_samples": pool.num_rows,
        "full_rebuild": parent_d != d,
    }
    report["seconds"]["incremental"] = round(time.perf_counter() - t0, 4)
    assert report["counts"]["in"] == report["counts"]["out"] == cost.num_rows
    return BalanceResult(plan=plan, report=report)


def _step_numbers(old_steps: np.ndarray, fresh) -> tuple[np.ndarray, np.ndarray]:
    """Step numbers for kept parent steps and for the fresh plan's steps.

    Kept steps keep their parent numbers when the fresh steps can fill the gaps exactly and the
    fresh short step (if any) can be the last step: then a kept group's tar members are byte for
    byte the parent's (the writer copies them as they are). Otherwise kept steps come first,
    renumbered, and fresh steps follow.
    """
    n_new = fresh.report["counts"]["steps"] if fresh else 0
    short = bool(fresh and fresh.report["last_step"]["short"])
    total = old_steps.size + n_new
    kept_map = np.full(int(old_steps.max(initial=-1)) + 1, -1, dtype=np.int64)
    stable = old_steps.size == 0 or (
        int(old_steps.max()) < total and not (short and int(old_steps.max()) == total - 1)
    )
    if stable:
        kept_map[old_steps] = old_steps
        holes = np.setdiff1d(np.arange(total), old_steps)
        return kept_map, holes.astype(np.int64)
    kept_map[old_steps] = np.arange(old_steps.size)
    return kept_map, np.arange(old_steps.size, total, dtype=np.int64)


def _rows_of(plan: pa.Table, cost: pa.Table) -> np.ndarray:
    """The cost table's row of each plan row."""
    where = {s: i for i, s in enumerate(cost.column("sample_id").to_pylist())}
    return np.array([where[s] for s in plan.column("sample_id").to_pylist()], dtype=np.int64)


def _with_phase_columns(plan: pa.Table, sl: SampleLoads, rows: np.ndarray) -> pa.Table:
    """The plan with each other encoder phase's group columns (audio), summed over each group's
    samples of the night's table: a kept parent group gets them even where the parent's plan
    predates the phase."""
    if not sl.others:
        return plan
    _, group = np.unique(plan.column("group_id").to_numpy(), return_inverse=True)
    cols = {}
    for p in sl.others:
        for key, name in ((p.tokens, f"group_{p.tokens}"), (cost_key(p), f"group_{p.name}_cost")):
            sums = np.bincount(group, weights=sl.loads[key][rows])[group]
            cols[name] = sums.astype(np.int64) if key == p.tokens else sums
    schema = plan_schema(sl.others).append(INCREMENTAL_PLAN_SCHEMA.field("parent_step"))
    return (
        pa.table({**{n: plan.column(n) for n in plan.column_names}, **cols})
        .select(schema.names)
        .cast(schema)
    )


def _report(plan, sl: SampleLoads, rows, cfg, d, nodes, fresh, n_steps) -> dict:
    """The usual report (counts, metrics against random batching, node balance, trend) over the
    combined plan."""
    cost = sl.table
    loads = {k: x[rows] for k, x in sl.loads.items()}
    step = plan.column("step").to_numpy()
    rank = plan.column("rank").to_numpy().astype(np.int64)
    slot = step * d + rank
    _, group_of = np.unique(slot, return_inverse=True)
    step_loads = {
        k: np.bincount(slot, weights=x, minlength=n_steps * d).reshape(n_steps, d)
        for k, x in loads.items()
    }
    short = bool(fresh and fresh.report["last_step"]["short"])
    n_full = n_steps - (1 if short else 0)
    pads = pad_ratios(group_stats(group_of, loads, int(group_of.max()) + 1))
    flags = plan.column("group_flag").to_pylist()
    by_flag: dict[str, set] = {}
    for f, g in zip(flags, plan.column("group_id").to_pylist(), strict=True):
        by_flag.setdefault(f, set()).add(g)
    n_groups = len(set(plan.column("group_id").to_pylist()))
    return {
        "counts": {
            "in": cost.num_rows,
            "out": plan.num_rows,
            "groups": n_groups,
            "steps": int(n_steps),
            "groups_by_flag": {k: len(v) for k, v in sorted(by_flag.items())},
            "avg_group_size": round(plan.num_rows / max(n_groups, 1), 4),
        },
        "last_step": fresh.report["last_step"]
        if fresh
        else {"short": False, "how": "no step was rebuilt", "samples": 0, "empty_ranks": 0},
        "parameters": fresh.report["parameters"]
        if fresh
        else {
            "dp": d,
            "nodes": nodes,
            "gpus_per_node": d // nodes,
            "target_batch": cfg.target_batch,
            "seed": cfg.seed,
            "cost_model": cfg.cost_model.describe(),
        },
        **plan_quality(
            step_loads,
            pads,
            n_full,
            nodes,
            random_batching_metrics(loads, cfg.target_batch, cfg.seed, d),
        ),
        "seconds": dict(fresh.report["seconds"]) if fresh else {},
    }
