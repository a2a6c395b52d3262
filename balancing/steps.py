"""Step assignment: order groups into global steps of D groups, then place them on (node, rank).

Groups are sorted by vision load, then LLM load, then modeled LLM cost; consecutive runs of D
groups form the steps, so the D groups of a step are alike in both phases (oversize and leftover
groups sort next to their peers by load). The steps are then shuffled by the seed, so their order
carries no trend. When the group count is not a multiple of D, the remaining groups (the last
ones in sorted order) are dissolved and their samples re-packed by LPT into D groups that form
the final, flagged step: no sample repeats, and a rank of that step may get fewer samples, or
none when there are fewer samples than ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from balancing._kernels.partition import _nb_lpt_capped
from balancing._kernels.placement import _nb_place_on_nodes
from balancing._kernels.tables import _nb_counting_argsort
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS

__all__ = ["StepAssignment", "assign_steps"]


@dataclass(slots=True)
class StepAssignment:
    """Per group: ``step``, ``node``, ``local_rank``; ``group_of`` may have new ids for samples of
    the final step (``last_step_groups`` lists them)."""

    group_of: np.ndarray
    step: np.ndarray
    node: np.ndarray
    local_rank: np.ndarray
    n_steps: int
    last_step_groups: np.ndarray


def _group_sums(group_of: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(group_of, weights=x, minlength=n)


def assign_steps(
    group_of: np.ndarray,
    n_groups: int,
    loads: dict[str, np.ndarray],
    *,
    nodes: int,
    gpus_per_node: int,
    rng: np.random.Generator,
) -> StepAssignment:
    """Assign groups to steps and (node, local rank).

    ``loads`` holds per-sample ``vit_tokens``, ``llm_tokens``, ``vit_cost``, ``llm_cost``.
    """
    d = nodes * gpus_per_node
    gv = _group_sums(group_of, loads[VIT_TOKENS], n_groups)
    gt = _group_sums(group_of, loads[LLM_TOKENS], n_groups)
    gct = _group_sums(group_of, loads["llm_cost"], n_groups)
    order = np.lexsort((gct, gt, gv))  # stable: ties keep group order
    n_full = n_groups // d
    full = order[: n_full * d].reshape(n_full, d)
    rest = order[n_full * d :]
    group_of = group_of.copy()
    step_of = np.full(n_groups + d, -1, dtype=np.int64)
    perm = rng.permutation(n_full)
    step_of[full[perm].ravel()] = np.repeat(np.arange(n_full), d)
    n_steps = n_full
    last = np.empty(0, dtype=np.int64)
    if rest.size:
        # Dissolve the remaining groups; LPT their samples over D new groups (the final step).
        dissolved = np.zeros(n_groups, dtype=np.bool_)
        dissolved[rest] = True
        members = np.flatnonzero(dissolved[group_of])
        w = loads["vit_cost"][members] / max(loads["vit_cost"].mean(), 1e-12)
        w = w + loads["llm_cost"][members] / max(loads["llm_cost"].mean(), 1e-12)
        order_m = np.lexsort((members, -w))
        bins = np.empty(members.size, dtype=np.int64)
        _nb_lpt_capped(w, order_m, d, 0, 0.0, w, bins)
        last = n_groups + np.arange(d)
        group_of[members] = last[bins]
        step_of[last] = n_steps
        n_steps += 1
    total = n_groups + (d if rest.size else 0)
    # Loads per (step, slot) for node placement, normalized so both phases weigh alike.
    placed = np.flatnonzero(step_of[:total] >= 0)
    by_step = placed[_nb_counting_argsort(step_of[placed], n_steps)].reshape(n_steps, d)
    gv_all = _group_sums(group_of, loads[VIT_TOKENS], total)
    gt_all = _group_sums(group_of, loads[LLM_TOKENS], total)
    lv = gv_all[by_step] / max(gv_all.mean(), 1e-12)
    lt = gt_all[by_step] / max(gt_all.mean(), 1e-12)
    node_s = np.empty((n_steps, d), dtype=np.int64)
    local_s = np.empty((n_steps, d), dtype=np.int64)
    _nb_place_on_nodes(lv, lt, nodes, gpus_per_node, node_s, local_s)
    node = np.full(total, -1, dtype=np.int64)
    local = np.full(total, -1, dtype=np.int64)
    node[by_step.ravel()] = node_s.ravel()
    local[by_step.ravel()] = local_s.ravel()
    return StepAssignment(
        group_of=group_of,
        step=step_of[:total],
        node=node,
        local_rank=local,
        n_steps=n_steps,
        last_step_groups=last,
    )
