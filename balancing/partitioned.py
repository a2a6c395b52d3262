"""A plan over partitions of a cost table (``equishard balance --engine ray``): each worker holds
one partition of the rows (:class:`~balancing.plan_part.PlanPart`); the driver holds numbers per
group, never per sample.

1. Each worker reads and checks its rows and makes their loads.
2. The caps are chosen from the loads of the rows ``auto_isf_params`` would draw from the whole
   table (:func:`~balancing.auto_params.sample_rows`), gathered from their workers: the same caps
   as the plan made in one process.
3. Each worker groups its samples with ISF (seeded by the seed and its partition), and sends
   its groups' statistics and its random batches.
4. The driver orders all groups into steps as one process does
   (:func:`~balancing.steps.order_steps`), dissolves the groups left over into the last step
   from their samples' loads (the only samples it is sent), and places every step's groups on
   (node, rank) (:func:`~balancing.steps.place_steps`).
5. The repeated-id check runs across the workers (each id goes to the worker its hash names),
   and the plan is written a slice of steps at a time, each worker sending its rows of the slice
   (:class:`PartRows`).

The plan differs from the one-process plan only in which samples share a group (ISF runs within a
partition); the same table, seed and number of partitions give the same plan, byte for byte.
Steps are not refined and a table with an audio phase is refused: both read samples across the
whole table (its refinement moves samples between the groups of a step; the report's LLM-only
ablation groups every sample again).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from balancing._kernels.tables import STAT_COUNT, STAT_SUM_T, STAT_SUM_TC, STAT_SUM_V
from balancing.auto_params import sample_rows
from balancing.isf import FLAG_LAST_STEP
from balancing.parts import Parts
from balancing.plan import BalanceConfig, BalanceResult, isf_params
from balancing.plan_quality import (
    PHASES,
    group_stats,
    pad_ratios,
    plan_quality,
    random_batch_size,
    random_metrics_of_summaries,
    step_loads_of,
)
from balancing.plan_report import plan_report
from balancing.plan_rows import DICTIONARY_COLUMNS, ROWS_PER_SLICE, PlanRows
from balancing.steps import last_step_bins, order_steps, place_steps, steps_of
from equishard.contracts.columns import (
    GROUP_LLM_COST,
    GROUP_LLM_TOKENS,
    GROUP_VIT_COST,
    GROUP_VIT_TOKENS,
)
from equishard.contracts.plan import plan_schema

__all__ = ["PartRows", "build_partitioned_plan"]


def _segments(x: np.ndarray, edges: list[int]) -> list[np.ndarray]:
    """The values of sorted ``x`` in each [edges[i], edges[i + 1])."""
    cut = np.searchsorted(x, edges)
    return [x[a:b] for a, b in itertools.pairwise(cut)]


def build_partitioned_plan(
    path: str, cfg: BalanceConfig, parts: Parts, bounds: list[tuple[int, int]]
) -> BalanceResult:
    """The plan of the cost table at ``path`` over ``parts``, one worker per partition of
    ``bounds`` (see the module). A ``ValueError`` naming the table for what is refused."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    nodes, per = cfg.topology
    d = nodes * per
    n_parts = len(bounds)
    starts = [a for a, _ in bounds] + [bounds[-1][1]]
    info = parts.call("load", [()] * n_parts)
    n = sum(x["rows"] for x in info)
    if n == 0:
        raise ValueError(f"{path}: the cost table has no rows: nothing to balance")
    others = sorted({name for x in info for name in x["others"]})
    if others:
        raise ValueError(
            f"{path}: the table has an audio phase ({', '.join(others)}); a plan over "
            "partitions (--partitions, --engine ray) balances tables of images, videos and "
            "text: balance it with --engine local and no --partitions"
        )
    has_media = any(x["has_media"] for x in info)
    if cfg.refine_steps == "on" or (cfg.refine_steps == "auto" and has_media):
        raise ValueError(
            f"{path}: a plan over partitions (--partitions, --engine ray) does not refine "
            f"steps (--refine-steps {cfg.refine_steps}"
            f"{', a table with videos' if has_media else ''}); give --refine-steps off, or "
            "balance with --engine local and no --partitions"
        )
    sums = {k: sum(x["sums"][k] for x in info) for k in info[0]["sums"]}
    timings["costs"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    v = t = None
    if cfg.q_v is None:  # the rows the one-process plan would draw, from their partitions
        pick = _segments(sample_rows(n, cfg.seed), starts)
        got = parts.call("sample", [(p - a,) for p, a in zip(pick, starts, strict=False)])
        v = np.concatenate([x[0] for x in got])
        t = np.concatenate([x[1] for x in got])
    params = isf_params(cfg, (), v, t, None)
    timings["params"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    batch = random_batch_size(cfg.target_batch, n)
    groups = parts.call("group", [(params, cfg.seed, batch, d)] * n_parts)
    timings["isf"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    sizes = [g["stats"].shape[0] for g in groups]
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    n_groups = int(offsets[-1])
    stats = np.concatenate([g["stats"] for g in groups])
    flags = np.concatenate([g["flags"] for g in groups])
    rounds = max(len(g["kept_per_round"]) for g in groups)
    kept = [
        sum(g["kept_per_round"][r] for g in groups if r < len(g["kept_per_round"]))
        for r in range(rounds)
    ]
    oversize_ids = pa.chunked_array([g["oversize"][1] for g in groups]).to_pylist()[:20]
    oversize = (sum(g["oversize"][0] for g in groups), oversize_ids)
    leftover = sum(g["leftover_samples"] for g in groups)
    random = random_metrics_of_summaries([g["random"] for g in groups], d)
    del groups

    rng = np.random.default_rng(cfg.seed)
    gv, gt = stats[:, STAT_SUM_V], stats[:, STAT_SUM_T]
    step_of, rest, n_steps = order_steps(gv, gt, stats[:, STAT_SUM_TC], [], d, rng)
    rest = np.sort(rest)
    dissolved = _segments(rest, list(offsets))
    got = parts.call(
        "dissolve", [(int(offsets[i]), dissolved[i] - offsets[i]) for i in range(n_parts)]
    )
    last = np.empty(0, dtype=np.int64)
    if rest.size:
        members = np.concatenate([x["rows"] for x in got])
        loads = {k: np.concatenate([x["loads"][k] for x in got]) for k in PHASES}
        costs = ("vit_cost", "llm_cost")
        bins = last_step_bins(members, [loads[k] for k in costs], [sums[k] / n for k in costs], d)
        last = n_groups + np.arange(d)
        stats[rest] = 0  # dissolved: no samples left
        stats = np.concatenate([stats, group_stats(bins, loads, d)])
        flags = np.concatenate([flags, np.full(d, FLAG_LAST_STEP, dtype=flags.dtype)])
        step_of[last] = n_steps
        n_steps += 1
        cut = np.cumsum([0, *(x["rows"].size for x in got)])
        parts.call("regroup", [(last[bins[a:b]],) for a, b in itertools.pairwise(cut)])
    else:
        parts.call("regroup", [(np.empty(0, dtype=np.int64),)] * n_parts)
    del got
    total = stats.shape[0]
    step = step_of[:total]
    by_step = steps_of(step, n_steps, d)
    node, local = place_steps(
        [stats[:, STAT_SUM_V], stats[:, STAT_SUM_T]], by_step, nodes=nodes, gpus_per_node=per
    )
    rank = node * per + local
    timings["steps"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    gsize = stats[:, STAT_COUNT].astype(np.int64)
    n_full = n_steps - (1 if last.size else 0)
    step_loads = step_loads_of(stats, step, rank, n_steps, d)
    quality = plan_quality(step_loads, pad_ratios(stats), n_full, nodes, random, None)
    per_group = {
        "step": step,
        "node": node.astype(np.int32),
        "local_rank": local.astype(np.int32),
        "rank": rank.astype(np.int32),
        "group_flag": flags,
        "group_size": gsize.astype(np.int32),
        GROUP_VIT_TOKENS: stats[:, STAT_SUM_V].astype(np.int64),
        GROUP_LLM_TOKENS: stats[:, STAT_SUM_T].astype(np.int64),
        GROUP_VIT_COST: np.ascontiguousarray(stats[:, PHASES.index("vit_cost") + STAT_SUM_V]),
        GROUP_LLM_COST: np.ascontiguousarray(stats[:, STAT_SUM_TC]),
    }
    del stats
    slot, n_slots = np.where(step >= 0, step * d + rank, -1), n_steps * d
    parts.call(
        "order",
        [
            (slot[offsets[i] : offsets[i + 1]], slot[n_groups:], n_groups, n_slots)
            for i in range(n_parts)
        ],
    )
    slot_rows = np.zeros(n_slots, dtype=np.int64)
    slot_rows[slot[step >= 0]] = gsize[step >= 0]
    rows = PartRows(parts, per_group, plan_schema(()), slot_rows)
    timings["metrics"] = time.perf_counter() - t1
    report = plan_report(
        cfg=cfg,
        params=params,
        others=(),
        topology=(nodes, per),
        n_in=n,
        n_out=rows.num_rows,
        gsize=gsize,
        flags=flags,
        n_steps=n_steps,
        last=last,
        oversize=oversize,
        leftover_samples=leftover,
        refine=False,
        kept_per_round=kept,
        quality=quality,
        timings=timings,
        engine={"partitions": n_parts},
    )
    if report["counts"]["in"] != report["counts"]["out"]:
        raise RuntimeError(f"{path}: {n} samples in, {rows.num_rows} in the plan")
    return BalanceResult(rows=rows, report=report)


class PartRows:
    """A partitioned plan's rows: each slice of whole steps asked of the workers, which send
    their rows of it in (step, rank) order; merged by slot (partitions in order within one,
    so a slot's rows keep their order in the table). ``slot_rows``: the rows of every slot."""

    __slots__ = ("parts", "per_group", "schema", "slot_rows")

    def __init__(
        self, parts: Parts, per_group: dict[str, np.ndarray], schema: pa.Schema, slot_rows
    ) -> None:
        self.parts, self.per_group, self.schema = parts, per_group, schema
        self.slot_rows = slot_rows

    @property
    def num_rows(self) -> int:
        return int(self.slot_rows.sum())

    def slices(self, rows_per_slice: int = ROWS_PER_SLICE):
        """Each slice of the plan (a table of whole slots, about ``rows_per_slice`` rows)."""
        if rows_per_slice < 1:
            raise ValueError(f"rows_per_slice must be at least 1, not {rows_per_slice}")
        ends = np.cumsum(self.slot_rows)
        cuts = np.searchsorted(ends, np.arange(rows_per_slice, self.num_rows, rows_per_slice))
        edges = np.unique(np.concatenate(([0], cuts + 1, [self.slot_rows.size])))
        for first, stop in itertools.pairwise(edges):
            got = self.parts.call("rows", [(int(first), int(stop))] * len(self.parts))
            slots = np.concatenate([x[2] for x in got])
            order = np.argsort(slots, kind="stable")
            expected = int(self.slot_rows[first:stop].sum())
            if order.size != expected:
                raise RuntimeError(
                    f"the workers sent {order.size} rows of slots {first}..{stop - 1}, "
                    f"not {expected}: nothing was published"
                )
            ids = pa.chunked_array([x[0] for x in got]).take(pa.array(order))
            groups = np.concatenate([x[1] for x in got])[order]
            yield PlanRows(ids, groups, self.per_group, self.schema).table()

    def table(self) -> pa.Table:
        return pa.concat_tables(list(self.slices())) if self.num_rows else next(self.slices())

    def column_max(self, name: str) -> int | float | None:
        if not self.num_rows:
            return None
        held = self.per_group["group_size"] > 0
        return self.per_group[name][held].max().item()

    def write(self, path, rows_per_slice: int = ROWS_PER_SLICE) -> None:
        """``plan.parquet`` at ``path``, one row group a slice."""
        with pq.ParquetWriter(path, self.schema, use_dictionary=DICTIONARY_COLUMNS) as writer:
            for table in self.slices(rows_per_slice):
                writer.write_table(table)
