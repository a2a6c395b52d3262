"""The offline balancing stage: cost table -> plan (``plan.parquet``) + ``report.json``.

``build_plan`` computes the modeled cost of every sample, chooses ISF caps (or takes given ones),
groups with ISF, assigns groups to steps and (node, local rank), and measures the result against
random batching of the same data with the metrics of ``balancing.metrics``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from balancing._kernels.tables import STAT_COUNT, STAT_SUM_V, _nb_counting_argsort
from balancing.auto_params import auto_isf_params
from balancing.baselines import llm_only_metrics
from balancing.checks import MAX_RANKS
from balancing.cost_model import CostModel
from balancing.isf import (
    FLAG_LAST_STEP,
    FLAG_LEFTOVER,
    FLAG_OVERSIZE,
    ISFParams,
    isf_group,
)
from balancing.loads import sample_loads
from balancing.plan_quality import (
    PHASES,
    extra_step_loads,
    group_stats,
    pad_ratios,
    plan_quality,
    random_batching_metrics,
    step_loads_of,
)
from balancing.plan_report import plan_report
from balancing.plan_rows import DICTIONARY_COLUMNS, PlanRows
from balancing.steps import assign_steps
from equishard.common.durable import durable_replace
from equishard.common.options import option
from equishard.common.values import check_count, check_real, is_count, is_number
from equishard.contracts.columns import (
    GROUP_LLM_COST,
    GROUP_LLM_TOKENS,
    GROUP_VIT_COST,
    GROUP_VIT_TOKENS,
    LLM_TOKENS,
    VIT_TOKENS,
)
from equishard.contracts.phases import ENCODER_PHASES
from equishard.contracts.plan import PLAN_PARQUET, PLAN_REPORT, PLAN_SCHEMA, plan_schema

__all__ = ["PLAN_SCHEMA", "BalanceConfig", "BalanceResult", "build_plan", "write_plan"]

REFINE_STEPS = ("auto", "on", "off")
MAX_ROUNDS = 1000  # ISF rounds; each is a full pass over the samples still ungrouped


@dataclass(frozen=True, kw_only=True)
class BalanceConfig:
    """How a plan is balanced; recorded in its report (``parameters``), from which a night
    balances its new samples the same way (:meth:`from_report`)."""

    dp: int = field(metadata=option("data-parallel size D (groups per step)", required=True))
    nodes: int | None = field(
        default=None, metadata=option("nodes (default: 1); nodes x gpus-per-node must equal --dp")
    )
    gpus_per_node: int | None = field(
        default=None, metadata=option("DP ranks per node (default: dp / nodes)")
    )
    target_batch: float = field(
        default=4.0, metadata=option("average samples per group (default: 4)", metavar="B")
    )
    seed: int = field(default=0, metadata=option("seed of grouping and step order (default: 0)"))
    rounds: int = field(default=10, metadata=option("ISF rounds (default: 10)", metavar="T"))
    slack: float = field(
        default=0.05,
        metadata=option("filter targets sit this fraction below the caps (default: 0.05)"),
    )
    q_v: int | None = field(
        default=None,
        metadata=option(
            "ISF's vision cap: encoder tokens a group may hold (default: chosen from the data)",
            flag="--vision-tokens-per-group",
            aliases=("--q-v",),
            metavar="TOKENS",
        ),
    )
    q_a: int | None = field(
        default=None,
        metadata=option(
            "ISF's audio cap, for a table with recordings: audio encoder positions a group may "
            "hold (default: chosen from the data)",
            flag="--audio-tokens-per-group",
            aliases=("--q-a",),
            metavar="TOKENS",
        ),
    )
    q_t: int | None = field(
        default=None,
        metadata=option(
            "ISF's LLM cap: LLM tokens a group may hold; a trainer that packs a group into one "
            "row runs rows of at most this many tokens, so size it against memory (see "
            "--row-memory; default: chosen from the data)",
            flag="--llm-tokens-per-group",
            aliases=("--q-t",),
            metavar="TOKENS",
        ),
    )
    refine_steps: str = field(
        default="auto",
        metadata=option(
            "even each step's groups in every phase by moving and swapping samples between "
            "them, and clear a phase out of the steps that hold only a little of it: auto "
            "(default) where the table has videos or recordings, whose large items ISF and the "
            "step sort alone leave uneven; on; off",
            choices=REFINE_STEPS,
        ),
    )
    cost_model: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        check_count("--dp", self.dp, 1, MAX_RANKS)
        if self.refine_steps not in REFINE_STEPS:
            raise ValueError(
                f"--refine-steps must be one of {', '.join(REFINE_STEPS)}, got "
                f"{self.refine_steps!r}"
            )
        for name, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node)):
            check_count(name, value, 1, MAX_RANKS, none=True)
        if not is_count(self.rounds, 1, MAX_ROUNDS + 1):
            raise ValueError(
                f"--rounds must be 1..{MAX_ROUNDS}, got {self.rounds!r}: ISF keeps most groups in "
                "its first rounds, and what is left after 10 is packed best-fit anyway"
            )
        check_count("--seed", self.seed, 0, (1 << 63) - 1)
        check_real("--slack", self.slack, 0.0, 1.0)
        for name, value in (
            ("--vision-tokens-per-group (--q-v)", self.q_v),
            ("--audio-tokens-per-group (--q-a)", self.q_a),
            ("--llm-tokens-per-group (--q-t)", self.q_t),
        ):
            check_count(f"{name} (tokens)", value, 1, none=True)
        nodes, per = self.topology
        if nodes * per != self.dp:
            raise ValueError(
                f"--nodes {nodes} x --gpus-per-node {per} = {nodes * per} ranks, but --dp is {self.dp}; "
                "give a layout whose product is the DP size"
            )
        if (self.q_v is None) != (self.q_t is None) or (self.q_a is not None and self.q_v is None):
            raise ValueError(
                "give both --vision-tokens-per-group and --llm-tokens-per-group (--q-v, --q-t), "
                "and --audio-tokens-per-group (--q-a) for a table with recordings, or none of "
                "them to choose them automatically"
            )
        check_real("--target-batch", self.target_batch, 1.0)

    @classmethod
    def from_report(cls, params, where: str) -> BalanceConfig:
        """The configuration a plan was balanced with, from its report's ``parameters`` (as
        recorded in a generation's manifest), so that a night balances its new samples exactly
        as the parent's were: layout, target batch, seed, ISF rounds and slack, explicit
        ``q_v``/``q_a``/``q_t`` (an automatic choice is made again for the night's samples), cost
        model. A ``ValueError`` naming ``where`` and the field for anything not recorded so."""

        if not isinstance(params, dict):
            raise ValueError(f"{where}: the plan report records no 'parameters' object")
        isf = params.get("isf", {})
        if not isinstance(isf, dict):
            raise ValueError(f"{where}: parameters.isf is not an object")
        bad = [k for k in ("dp", "nodes", "gpus_per_node", "seed") if not is_count(params.get(k))]
        bad += [k for k in ("rounds",) if k in isf and not is_count(isf[k])]
        bad += [k for k in ("refine_steps",) if params.get(k, "auto") not in REFINE_STEPS]
        if isf.get("auto") is False:
            bad += [f"isf.{k}" for k in ("q_v", "q_t") if not is_count(isf.get(k))]
            bad += [k for k in ("isf.q_a",) if k[4:] in isf and not is_count(isf[k[4:]])]
        numbers = {"target_batch": params.get("target_batch"), "isf.slack": isf.get("slack", 0)}
        bad += [k for k, v in numbers.items() if not is_number(v) or v != v]
        if bad:
            raise ValueError(f"{where}: plan parameters {bad} are missing or not numbers")
        cm = params.get("cost_model")
        try:
            return cls(
                dp=params["dp"],
                nodes=params["nodes"],
                gpus_per_node=params["gpus_per_node"],
                target_batch=params["target_batch"],
                seed=params["seed"],
                rounds=isf.get("rounds", 10),
                slack=isf.get("slack", 0.05),
                q_v=isf["q_v"] if isf.get("auto") is False else None,
                q_t=isf["q_t"] if isf.get("auto") is False else None,
                q_a=isf.get("q_a") if isf.get("auto") is False else None,
                refine_steps=params.get("refine_steps", "auto"),
                cost_model=CostModel.from_record(cm, "cost_model")
                if cm is not None
                else CostModel(),
            )
        except ValueError as exc:
            raise ValueError(
                f"{where}: the recorded plan parameters are not valid: {exc}"
            ) from None

    @property
    def topology(self) -> tuple[int, int]:
        if self.nodes is None and self.gpus_per_node is None:
            return 1, self.dp
        if self.nodes is None:
            return max(1, self.dp // self.gpus_per_node), self.gpus_per_node
        if self.gpus_per_node is None:
            return self.nodes, max(1, self.dp // self.nodes)
        return self.nodes, self.gpus_per_node


class BalanceResult:
    """A plan and its report. The plan's table (``plan``) is made when first asked for, from
    its rows' groups (:class:`~balancing.plan_rows.PlanRows`); :func:`write_plan` writes it a
    slice at a time without it. Give ``plan`` (a made table) or ``rows``."""

    __slots__ = ("_plan", "report", "rows")

    def __init__(
        self, *, report: dict, plan: pa.Table | None = None, rows: PlanRows | None = None
    ) -> None:
        if (plan is None) == (rows is None):
            raise ValueError("give a BalanceResult its plan or its rows, one of them")
        self._plan, self.rows, self.report = plan, rows, report

    @property
    def plan(self) -> pa.Table:
        if self._plan is None:
            self._plan = self.rows.table()
        return self._plan

    def write_parquet(self, path: str | Path) -> None:
        """The plan's rows as a Parquet file at ``path``: from its rows a slice at a time where
        its table was not made, else from the table (the same rows and encodings)."""
        if self.rows is not None and self._plan is None:
            self.rows.write(path)
        else:
            pq.write_table(self.plan, path, use_dictionary=DICTIONARY_COLUMNS)

    def column_max(self, name: str):
        """A per-group column's largest value over the plan's rows (None: no rows), without
        making the table."""
        if self.rows is not None and self._plan is None:
            return self.rows.column_max(name)
        return pc.max(self._plan.column(name)).as_py()


def isf_params(
    cfg: BalanceConfig, others: tuple, v: np.ndarray, t_group: np.ndarray, extra
) -> ISFParams:
    """ISF's caps and targets: the configuration's, else chosen from the samples' vision
    tokens ``v``, LLM tokens ``t_group`` and other encoders' tokens ``extra`` (all of a table's,
    or the same subsample of them ``auto_isf_params`` draws); ``others``: the table's encoder
    phases beside the vision tower."""
    if (cfg.q_a is not None) != bool(others) and cfg.q_v is not None:
        raise ValueError(
            "the cost table has recordings: give --audio-tokens-per-group (--q-a) with the other "
            "caps"
            if others
            else "--audio-tokens-per-group (--q-a) is given but the cost table has no audio phase"
        )
    if cfg.q_v is not None:
        q_e = (cfg.q_a,) if others else ()
        return ISFParams(
            q_v=cfg.q_v,
            q_t=cfg.q_t,
            qf_v=max(1, int(cfg.q_v * (1 - cfg.slack))),
            qf_t=max(1, int(cfg.q_t * (1 - cfg.slack))),
            rounds=cfg.rounds,
            q_e=q_e,
            qf_e=tuple(max(1, int(q * (1 - cfg.slack))) for q in q_e),
        )
    return auto_isf_params(
        v,
        t_group,
        extra=extra,
        target_batch=cfg.target_batch,
        seed=cfg.seed,
        slack=cfg.slack,
        rounds=cfg.rounds,
    )


def build_plan(table: pa.Table, cfg: BalanceConfig) -> BalanceResult:
    """Group, assign and place every sample of a cost table; nothing is dropped."""
    timings = {}
    t0 = time.perf_counter()
    n = table.num_rows
    if n == 0:
        raise ValueError("the cost table has no rows: nothing to balance")
    nodes, per = cfg.topology
    d = nodes * per
    # what balancing reads of a row: its id, every encoder phase's columns and its LLM tokens
    # (a table's sources, text counts and own columns are not held while the loads are made)
    read = {"sample_id", LLM_TOKENS, *(c for p in ENCODER_PHASES for c in p.columns)}
    table = table.select([c for c in table.column_names if c in read])
    pa.default_memory_pool().release_unused()
    sl = sample_loads(table, cfg.cost_model)
    loads = sl.loads
    v = sl.tokens(VIT_TOKENS)
    t = sl.tokens(LLM_TOKENS)
    extra = sl.extra_tokens()  # the other encoders' tokens (audio); None for vision + LLM
    others, extra_pairs, has_media = sl.others, sl.extra_keys, sl.has_media
    # of the table only the sample ids are read again: its other columns (the ViT sequence
    # lists the largest) are not held through the build where the caller lets go of it too
    ids = sl.table.column("sample_id")
    del table, sl
    pa.default_memory_pool().release_unused()  # arrow's allocator keeps freed pages otherwise
    # ISF groups by tokens; a sample of no tokens at all (a table of zeros, imported or made by
    # hand) still counts as one, so such samples spread by count instead of piling into one group
    t_group = np.maximum(t, 1)
    del t
    timings["costs"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    params = isf_params(cfg, others, v, t_group, extra)
    timings["params"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    groups = isf_group(v, t_group, params, rng, extra=extra)
    del v, extra  # read by ISF alone (the loads hold what the rest reads)
    if not others:
        del t_group  # read again only by the LLM-only ablation of a table with recordings
    timings["isf"] = time.perf_counter() - t1
    # the report's random-batching baseline reads only the loads: on another core (its kernel
    # releases the GIL) while the steps are assigned (beside ISF's records it was the peak)
    pool = ThreadPoolExecutor(1, thread_name_prefix="equishard-random-baseline")
    random_job = pool.submit(random_batching_metrics, loads, cfg.target_batch, cfg.seed, d)
    pool.shutdown(wait=False)  # the job runs on; the pool takes no other

    t1 = time.perf_counter()
    # a step's groups are refined where ISF and the step sort leave large items uneven
    refine = cfg.refine_steps == "on" or (cfg.refine_steps == "auto" and has_media)
    a = assign_steps(
        groups.group_of,
        groups.n_groups,
        loads,
        nodes=nodes,
        gpus_per_node=per,
        rng=rng,
        extra=extra_pairs,
        caps=params.caps if refine else None,
    )
    flags = np.concatenate(
        [groups.flags, np.full(a.last_step_groups.size, FLAG_LAST_STEP, dtype=np.int8)]
    )
    rank = a.node * per + a.local_rank
    # each sample's ISF group's kind (before the last step)
    sample_flag = groups.flags[groups.group_of]
    kept_per_round = groups.kept_per_round
    del groups  # its sample -> group column too (80 MB at 10M rows), before the metrics
    timings["steps"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    n_total = a.step.shape[0]
    stats = group_stats(a.group_of, loads, n_total)
    gsum = {k: stats[:, col] for col, k in enumerate(PHASES, start=STAT_SUM_V)}
    gsize = stats[:, STAT_COUNT].astype(np.int64)
    step_loads = step_loads_of(stats, a.step, rank, a.n_steps, d)
    extra_keys = [k for pair in extra_pairs for k in pair]
    step_loads.update(extra_step_loads(a.group_of, loads, extra_keys, a.step, rank, a.n_steps, d))
    gextra = {k: np.bincount(a.group_of, weights=loads[k], minlength=n_total) for k in extra_keys}
    pads = pad_ratios(stats)
    n_full = a.n_steps - (1 if a.last_step_groups.size else 0)
    random = random_job.result()
    timings["metrics"] = time.perf_counter() - t1
    llm_only = None
    if others:  # OrchMLLM's ablation: what balancing the LLM alone leaves the encoders
        t1 = time.perf_counter()
        llm_only = llm_only_metrics(
            loads,
            t_group,
            target_batch=cfg.target_batch,
            seed=cfg.seed,
            slack=cfg.slack,
            rounds=cfg.rounds,
            nodes=nodes,
            gpus_per_node=per,
        )
        timings["llm_only"] = time.perf_counter() - t1
        del t_group
    # the per-sample loads are done with: their 320 MB at 10M rows are not held while the plan's
    # rows are made
    del loads

    slot = a.step * d + rank  # (step, rank) of each group; a stable sort keeps input order inside
    order = _nb_counting_argsort(slot[a.group_of], a.n_steps * d)
    g = a.group_of[order]
    sample_ids = ids.take(pa.array(order))
    del order
    per_group = {  # each in its final type; every row repeats its group's (PlanRows)
        "step": a.step,
        "node": a.node.astype(np.int32),
        "local_rank": a.local_rank.astype(np.int32),
        "rank": rank.astype(np.int32),
        "group_flag": flags,
        "group_size": gsize.astype(np.int32),
        GROUP_VIT_TOKENS: gsum[VIT_TOKENS].astype(np.int64),
        GROUP_LLM_TOKENS: gsum[LLM_TOKENS].astype(np.int64),
        GROUP_VIT_COST: np.ascontiguousarray(gsum["vit_cost"]),
        GROUP_LLM_COST: np.ascontiguousarray(gsum["llm_cost"]),
        **{
            f"group_{k}": x.astype(np.int64) if k.endswith("_tokens") else x
            for k, x in gextra.items()
        },
    }
    rows = PlanRows(sample_ids, g, per_group, plan_schema(others))
    report = plan_report(
        cfg=cfg,
        params=params,
        others=others,
        topology=(nodes, per),
        n_in=n,
        n_out=rows.num_rows,
        gsize=gsize,
        flags=flags,
        n_steps=a.n_steps,
        last=a.last_step_groups,
        oversize=(
            int((sample_flag == FLAG_OVERSIZE).sum()),
            ids.take(pa.array(np.flatnonzero(sample_flag == FLAG_OVERSIZE)[:20])).to_pylist(),
        ),
        leftover_samples=int((sample_flag == FLAG_LEFTOVER).sum()),
        refine=refine,
        kept_per_round=kept_per_round,
        quality=plan_quality(step_loads, pads, n_full, nodes, random, llm_only),
        timings=timings,
    )
    assert report["counts"]["in"] == report["counts"]["out"]
    return BalanceResult(rows=rows, report=report)


def write_plan(
    result: BalanceResult, plan_dir: str | Path, *, before_publish: Callable[[], None] | None = None
) -> None:
    """Write ``plan.parquet`` and ``report.json`` into ``plan_dir``, each by an atomic rename.
    ``before_publish``: called once the plan is written and before anything is renamed into
    place; what it raises leaves ``plan_dir`` as it was (the CLI's repeated-id check, run on
    the other core while the plan is written)."""
    out = Path(plan_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{PLAN_PARQUET}.tmp-{os.getpid()}"
    try:
        result.write_parquet(tmp)
        if before_publish is not None:
            before_publish()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    durable_replace(tmp, out / PLAN_PARQUET)
    tmp = out / f".{PLAN_REPORT}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(result.report, indent=2) + "\n")
    durable_replace(tmp, out / PLAN_REPORT)
