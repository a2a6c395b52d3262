"""The quality section of a plan's report: per-group statistics, per-step loads, dist ratio,
efficiency and pad ratio of the plan, of its full steps and of random batching of the same
samples, node balance and the trend over steps (metric definitions: ``balancing.metrics``).
Shared by fresh (``plan``) and incremental (``incremental``) plans.
"""

from __future__ import annotations

import numpy as np

from balancing._kernels.tables import (
    STAT_SUM_V,
    _nb_block_stats,
    _nb_group_stats,
    _nb_stats_pad_ratios,
)
from balancing.metrics import dist_ratio, efficiency
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS

__all__ = [
    "PHASES",
    "group_stats",
    "pad_ratios",
    "plan_quality",
    "random_batching_metrics",
    "step_loads_of",
]

PHASES = (VIT_TOKENS, LLM_TOKENS, "vit_cost", "llm_cost")  # = columns STAT_SUM_V .. _TC


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


def _metrics(loads: dict[str, np.ndarray], pads: dict[str, float]) -> dict:
    out = dict(pads)
    for name, key in (("vit", VIT_TOKENS), ("llm", LLM_TOKENS)):
        out[f"dist_ratio_{name}"] = dist_ratio(loads[key])
        out[f"efficiency_{name}"] = efficiency(loads[key])
    for name, key in (("vit", "vit_cost"), ("llm", "llm_cost")):
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


def plan_quality(
    step_loads: dict[str, np.ndarray], pads: dict, n_full: int, nodes: int, random: dict
) -> dict:
    """The report's ``metrics`` (against ``random``), ``node_balance`` and ``trend`` sections
    from [steps, D] loads per phase; the first ``n_full`` steps are the full ones."""
    n_steps, d = step_loads[VIT_TOKENS].shape
    node = {k: x.reshape(n_steps, nodes, d // nodes).sum(axis=2) for k, x in step_loads.items()}
    full = {k: x[:n_full] for k, x in step_loads.items()}
    return {
        "metrics": {
            "random": random,
            "balanced": _metrics(step_loads, pads),
            "balanced_full_steps": _metrics(full, pads) if n_full else {},
        },
        "node_balance": {
            "dist_ratio_vit": round(dist_ratio(node[VIT_TOKENS]), 6),
            "dist_ratio_llm": round(dist_ratio(node[LLM_TOKENS]), 6),
        },
        "trend": {"vit": _trend(full[VIT_TOKENS]), "llm": _trend(full[LLM_TOKENS])},
    }


def random_batching_metrics(
    loads: dict[str, np.ndarray], target_batch: float, seed: int, d: int
) -> dict:
    """Metrics of random batching of the same samples: B per rank, D ranks per step (the usual
    sampler), the baseline every report compares against. Batch k holds the samples
    ``perm[k*B:(k+1)*B]`` of a seeded permutation."""
    n = loads[VIT_TOKENS].size
    b = max(1, round(min(target_batch, n)))  # at most the whole table
    perm = np.random.default_rng(seed + 1).permutation(n)
    stats = _nb_block_stats(perm, b, *(loads[k] for k in PHASES))
    r_steps = stats.shape[0] // d
    random_loads = {}
    for col, k in enumerate(PHASES, start=STAT_SUM_V):
        per_batch = np.ascontiguousarray(stats[:, col])  # rows of D: reductions run fast
        random_loads[k] = (
            per_batch[: r_steps * d].reshape(r_steps, d) if r_steps else per_batch[None, :d]
        )
    return _metrics(random_loads, pad_ratios(stats))
