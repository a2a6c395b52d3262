"""The quality section of a plan's report: per-group statistics, per-step loads, dist ratio,
efficiency and pad ratio of the plan, of its full steps and of random batching of the same
samples, node balance and the trend over steps (metric definitions: ``balancing.metrics``).
Shared by fresh (``plan``) and incremental (``incremental``) plans.

The vision tower and the LLM are in every report; another encoder phase (audio) is where the
loads have its keys (:data:`REPORTED`): its dist ratio, efficiency, node balance and trend
beside theirs.
"""

from __future__ import annotations

import numpy as np

from balancing._kernels.tables import (
    STAT_MAX_T,
    STAT_MAX_V,
    STAT_SUM_V,
    _nb_block_stats,
    _nb_group_stats,
    _nb_stats_pad_ratios,
)
from balancing.metrics import dist_ratio, efficiency, step_dist_ratios
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS
from equishard.contracts.phases import REPORTED as REPORTED_PHASES

__all__ = [
    "PHASES",
    "REPORTED",
    "encoder_gain",
    "extra_step_loads",
    "group_stats",
    "metrics_of",
    "pad_ratios",
    "plan_quality",
    "random_batch_size",
    "random_batches",
    "random_batching_metrics",
    "random_metrics",
    "random_metrics_of_summaries",
    "random_summary",
    "step_loads_of",
]

PHASES = (VIT_TOKENS, LLM_TOKENS, "vit_cost", "llm_cost")  # = columns STAT_SUM_V .. _TC
# (report name, tokens key, cost key) of every phase a report can show, in the order shown
REPORTED = tuple((p.report, p.tokens, p.cost_key) for p in REPORTED_PHASES)


def _shown(loads: dict) -> list[tuple[str, str, str]]:
    return [r for r in REPORTED if r[1] in loads]


def step_loads_of(
    stats: np.ndarray, step: np.ndarray, rank: np.ndarray, n_steps: int, d: int
) -> dict[str, np.ndarray]:
    """[steps, D] load of every phase from the per-group ``stats`` (groups in no step skipped)."""
    ok = np.flatnonzero(step >= 0)
    slot = step[ok] * d + rank[ok]
    out = {}
    for col, k in enumerate(PHASES, start=STAT_SUM_V):
        loads = np.zeros(n_steps * d)
        loads[slot] = stats[ok, col]
        out[k] = loads.reshape(n_steps, d)
    return out


def extra_step_loads(
    group_of: np.ndarray,
    loads: dict[str, np.ndarray],
    keys,
    step: np.ndarray,
    rank: np.ndarray,
    n_steps: int,
    d: int,
) -> dict[str, np.ndarray]:
    """[steps, D] load of each of ``keys`` (phases beyond the per-group ``stats``: audio),
    summed over each sample's group's (step, rank); groups in no step skipped."""
    if not keys:
        return {}
    gs = step[group_of]
    ok = gs >= 0
    slot = gs[ok] * d + rank[group_of][ok]
    return {
        k: np.bincount(slot, weights=loads[k][ok], minlength=n_steps * d).reshape(n_steps, d)
        for k in keys
    }


def metrics_of(loads: dict[str, np.ndarray], pads: dict[str, float]) -> dict:
    """Dist ratio and efficiency of every phase of [steps, D] ``loads`` (tokens and modeled
    cost), with the pad ratios ``pads``; rounded as a report shows them."""
    out = dict(pads)
    shown = _shown(loads)
    for name, key, _ in shown:
        out[f"dist_ratio_{name}"] = dist_ratio(loads[key])
        out[f"efficiency_{name}"] = efficiency(loads[key])
    for name, _, key in shown:
        out[f"dist_ratio_{name}_cost"] = dist_ratio(loads[key])
        out[f"efficiency_{name}_cost"] = efficiency(loads[key])
    return {k: round(float(v), 6) for k, v in out.items()}


def group_stats(group_of: np.ndarray, loads: dict[str, np.ndarray], n_groups: int) -> np.ndarray:
    """(n_groups, 7): count, the four loads' sums and the token maxima of every group, in one
    pass over the samples (columns ``STAT_*`` of ``balancing._kernels``)."""
    return _nb_group_stats(group_of, *(loads[k] for k in PHASES), n_groups)


def pad_ratios(stats: np.ndarray) -> dict[str, float]:
    """Mean pad ratio (``metrics.pad_ratio``) of both phases over the non-empty groups."""
    pv, pt = _nb_stats_pad_ratios(stats)
    return {"pad_ratio_vit": pv, "pad_ratio_llm": pt}


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties sharing their average rank (as Spearman's rho needs)."""
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return (first + (counts - 1) / 2.0)[inv]


def _trend(step_loads: np.ndarray) -> dict:
    """Does the per-step mean load drift with the step index? (rank correlation, halves)"""
    m = step_loads.mean(axis=1)
    if m.size < 4:
        return {"spearman": 0.0, "second_half_over_first": 1.0}
    rho = float(np.corrcoef(np.arange(m.size), _average_ranks(m))[0, 1]) if m.std() > 0 else 0.0
    half = m.size // 2
    ratio = float(m[half:].mean() / m[:half].mean()) if m[:half].mean() > 0 else 1.0
    return {"spearman": round(rho, 4), "second_half_over_first": round(ratio, 4)}


def encoder_gain(balanced: dict, llm_only: dict) -> dict:
    """Per encoder phase: its dist ratio under the LLM-only plan over its dist ratio under the
    plan (how many times more even the plan makes it; ``inf`` where the plan is exact)."""
    out = {}
    for name, tokens, _ in REPORTED:
        key = f"dist_ratio_{name}"
        if tokens == LLM_TOKENS or key not in balanced:
            continue
        base, got = llm_only[key], balanced[key]
        out[name] = round(base / got, 3) if got > 0 else float("inf")
    return out


def plan_quality(
    step_loads: dict[str, np.ndarray],
    pads: dict,
    n_full: int,
    nodes: int,
    random: dict,
    llm_only: dict | None = None,
) -> dict:
    """The report's ``metrics`` (against ``random`` and, where given, the ``llm_only`` plan's,
    :mod:`balancing.baselines`), ``node_balance`` and ``trend`` sections from [steps, D] loads
    per phase; the first ``n_full`` steps are the full ones."""
    n_steps, d = step_loads[VIT_TOKENS].shape
    node = {k: x.reshape(n_steps, nodes, d // nodes).sum(axis=2) for k, x in step_loads.items()}
    full = {k: x[:n_full] for k, x in step_loads.items()}
    balanced = metrics_of(step_loads, pads)
    baseline = {}
    if llm_only is not None:
        baseline = {"llm_only": llm_only, "encoder_gain": encoder_gain(balanced, llm_only)}
    return {
        "metrics": {
            "random": random,
            "balanced": balanced,
            "balanced_full_steps": metrics_of(full, pads) if n_full else {},
            **baseline,
        },
        "node_balance": {
            f"dist_ratio_{name}": round(dist_ratio(node[key]), 6)
            for name, key, _ in _shown(step_loads)
        },
        "trend": {name: _trend(full[key]) for name, key, _ in _shown(step_loads)},
    }


def random_batching_metrics(
    loads: dict[str, np.ndarray], target_batch: float, seed: int, d: int
) -> dict:
    """Metrics of random batching of the same samples: B per rank, D ranks per step (the usual
    sampler), the baseline every report compares against. Batch k holds the samples
    ``perm[k*B:(k+1)*B]`` of a seeded permutation."""
    n = loads[VIT_TOKENS].size
    b = random_batch_size(target_batch, n)
    stats, extra = random_batches(loads, b, np.random.default_rng(seed + 1))
    return random_metrics(stats, extra, d)


def random_batch_size(target_batch: float, n: int) -> int:
    """B of the random-batching baseline: the target batch rounded, at most the ``n`` samples."""
    return max(1, round(min(target_batch, n)))


def random_batches(
    loads: dict[str, np.ndarray], b: int, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Random batches of ``b`` of the samples of ``loads`` (a permutation by ``rng``; the last
    batch may be short): their statistics (``group_stats``' columns) and each other phase's
    (audio) per-batch sums."""
    n = loads[VIT_TOKENS].size
    perm = rng.permutation(n)
    stats = _nb_block_stats(perm, b, *(loads[k] for k in PHASES))
    extra = {  # the phases beyond the stats table's (audio)
        k: np.bincount(np.arange(n) // b, weights=loads[k][perm])
        for _, tokens, cost in _shown(loads)
        for k in (tokens, cost)
        if k not in PHASES
    }
    return stats, extra


def random_metrics(stats: np.ndarray, extra: dict[str, np.ndarray], d: int) -> dict:
    """The baseline's metrics from its batches (:func:`random_batches`): D batches a step, in
    order; the batches that fill no whole step left out (all of them in one step where fewer
    than D)."""
    r_steps = stats.shape[0] // d
    pads = pad_ratios(stats)
    batches = {k: np.ascontiguousarray(stats[:, col]) for col, k in enumerate(PHASES, STAT_SUM_V)}
    # each let go once read: the baseline runs beside the build (at 30M rows 1 GB at once)
    del stats
    batches.update(extra)
    random_loads = {}
    for k, per_batch in batches.items():  # rows of D: reductions run fast
        random_loads[k] = (
            per_batch[: r_steps * d].reshape(r_steps, d) if r_steps else per_batch[None, :d]
        )
    return metrics_of(random_loads, pads)


def random_summary(stats: np.ndarray, d: int) -> dict:
    """One partition's random batches (:func:`random_batches`' statistics, in order) summed for
    :func:`random_metrics_of_summaries`: its whole steps of D batches (batches that fill no
    whole step of the partition are left out of the steps, not of the pad ratios), each
    phase's sums over them of the steps' dist ratios, mean loads and largest loads, the pad
    ratios' sums and counts; ``short``: the batches themselves where they fill no step."""
    steps = stats.shape[0] // d
    pv, pt = _nb_stats_pad_ratios(stats)
    nv, nt = int((stats[:, STAT_MAX_V] > 0).sum()), int((stats[:, STAT_MAX_T] > 0).sum())
    phases = {}
    for col, k in enumerate(PHASES, STAT_SUM_V):
        x = stats[: steps * d, col].reshape(steps, d)
        phases[k] = (
            float(step_dist_ratios(x).sum()),
            float(x.mean(axis=1).sum()),
            float(x.max(axis=1).sum()) if steps else 0.0,
        )
    return {
        "steps": steps,
        "phases": phases,
        "pads": {"pad_ratio_vit": (pv * nv, nv), "pad_ratio_llm": (pt * nt, nt)},
        "short": None if steps else stats,
    }


def random_metrics_of_summaries(summaries: list[dict], d: int) -> dict:
    """The random-batching baseline's metrics (as :func:`random_metrics` names and rounds
    them) over the whole steps of every partition (:func:`random_summary`): the mean step dist
    ratio, mean over largest load summed over steps, the mean pad ratio over batches. Where no
    partition fills a step, its batches form one short step (as one table's do)."""
    steps = sum(s["steps"] for s in summaries)
    if steps == 0:
        return random_metrics(np.concatenate([s["short"] for s in summaries]), {}, d)
    out = {}
    for k in ("pad_ratio_vit", "pad_ratio_llm"):
        total = sum(s["pads"][k][0] for s in summaries)
        out[k] = total / max(sum(s["pads"][k][1] for s in summaries), 1)
    sums = {k: np.sum([s["phases"][k] for s in summaries], axis=0) for k in PHASES}
    for name, tokens, cost in _shown(sums):
        for key, suffix in ((tokens, ""), (cost, "_cost")):
            ratios, means, maxes = sums[key]
            out[f"dist_ratio_{name}{suffix}"] = ratios / steps
            out[f"efficiency_{name}{suffix}"] = means / maxes if maxes > 0 else 1.0
    return {k: round(float(v), 6) for k, v in out.items()}
