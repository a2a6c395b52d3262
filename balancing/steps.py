"""Step assignment: order groups into global steps of D groups, then place them on (node, rank).

Groups are sorted by each other encoder's load (audio) in coarse levels of its logarithm (see
:func:`coarse`), then vision load, then LLM load, then modeled LLM cost; consecutive runs of D
groups form the steps, so the D groups of a step are alike in every phase (oversize and leftover
groups sort next to their peers by load). The steps are then shuffled by the seed, so their order
carries no trend. When the group count is not a multiple of D, the remaining groups (the last
ones in sorted order) are dissolved and their samples re-packed by LPT into D groups that form
the final, flagged step: no sample repeats, and a rank of that step may get fewer samples, or
none when there are fewer samples than ranks.

Given the caps (a table with media), each step's groups are refined in every phase; then where
a phase's groups with and without it met in the order, a step holding only a little of it, on a
few of its groups, gives those items to steps that carry it in every group
(:func:`clear_sparse_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from balancing._kernels.partition import _nb_lpt_capped
from balancing._kernels.placement import _nb_place_on_nodes
from balancing._kernels.sparse_steps import _nb_clear_sparse
from balancing._kernels.step_refine import _nb_refine_steps
from balancing._kernels.tables import _nb_counting_argsort
from equishard.contracts.columns import LLM_TOKENS, VIT_TOKENS

__all__ = [
    "StepAssignment",
    "assign_steps",
    "clear_sparse_steps",
    "last_step_bins",
    "order_steps",
    "per_sample",
    "place_steps",
    "refine_steps",
    "steps_of",
]

COARSE_LEVELS = 16  # sort levels of an encoder phase's load beside the vision tower
MAX_MOVES = 4096  # moves per step; a step converges in far fewer (one per sample, about)


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


def coarse(x: np.ndarray, levels: int = COARSE_LEVELS) -> np.ndarray:
    """A group load as a sort key of few values: as it is where it takes at most ``levels``
    values (whole recordings of a padded encoder: 0, 1,500, 3,000, ...), else 0 for no load
    and, for a load, its bin among ``levels - 1`` equal bins of its logarithm between the
    smallest load and the largest (a bin's loads differ by a bounded factor: equal bins of the
    range would put a group of 10 positions beside one of 400 in the first, a step of them
    40x uneven); the next key then orders groups within a bin. No load is a level of its own
    so that groups without the phase never share a step with groups of a little of it (a step
    where one rank holds a short recording and the others none is a step all but empty of the
    phase, yet as uneven as a step can be)."""
    if np.unique(x).size <= levels:
        return x
    pos = x[x > 0]
    lo, hi = np.log(pos.min()), np.log(pos.max())
    scale = (levels - 1) / (hi - lo) if hi > lo else 0.0
    bins = np.minimum(np.floor((np.log(np.maximum(x, pos.min())) - lo) * scale), levels - 2) + 1
    return np.where(x > 0, bins, 0)


def per_sample(tokens: list[np.ndarray] | np.ndarray) -> np.ndarray:
    """Each phase's per-sample loads as one (samples, phases) int64 array (built once a plan,
    shared by the step refinement and the clearing); an array given is taken as it is."""
    if isinstance(tokens, np.ndarray):
        return tokens
    return np.stack([np.asarray(t).astype(np.int64) for t in tokens], axis=1)


def refine_steps(
    group_of: np.ndarray,
    step_of: np.ndarray,
    by_step: np.ndarray,
    tokens: list[np.ndarray] | np.ndarray,
    caps: np.ndarray,
    max_moves: int = MAX_MOVES,
) -> np.ndarray:
    """The samples' groups after each step's groups were refined in every phase at once:
    moves and swaps between a step's groups that lower the sum over the phases of the groups'
    squared loads (``balancing._kernels.step_refine``), no group passing a cap of ``caps`` it
    was under.
    ``by_step[s]``: step s's groups in slot order; ``tokens``: each phase's per-sample loads
    (:func:`per_sample`)."""
    n_steps, d = by_step.shape
    step = step_of[group_of]
    members = _nb_counting_argsort(step, n_steps)
    starts = np.searchsorted(step[members], np.arange(n_steps + 1))
    slot_of_group = np.empty(step_of.shape[0], dtype=np.int64)
    slot_of_group[by_step.ravel()] = np.tile(np.arange(d), n_steps)
    slot = slot_of_group[group_of]
    x = per_sample(tokens)
    _nb_refine_steps(x, members, starts, slot, d, caps.astype(np.int64), max_moves)
    return by_step[step, slot]


def clear_sparse_steps(
    group_of: np.ndarray,
    by_step: np.ndarray,
    tokens: list[np.ndarray] | np.ndarray,
    caps: np.ndarray,
    n_groups: int,
) -> np.ndarray:
    """The samples' groups after every step that holds only a little of a phase was cleared of
    it (``balancing._kernels.sparse_steps``): its items of the phase moved to the lightest
    groups of steps where every group carries the phase, under the caps and no step's largest
    load raised. ``by_step[s]``: step s's groups; ``tokens``: each phase's per-sample loads
    (:func:`per_sample`)."""
    x = per_sample(tokens)
    out = np.array(group_of, dtype=np.int64)
    _nb_clear_sparse(x, out, by_step.astype(np.int64), caps.astype(np.int64), n_groups)
    return out


def order_steps(
    gv: np.ndarray, gt: np.ndarray, gct: np.ndarray, ge: list[np.ndarray], d: int, rng
) -> tuple[np.ndarray, np.ndarray, int]:
    """The full steps from the groups' sums (vision tokens ``gv``, LLM tokens ``gt``, modeled LLM
    cost ``gct``, each other encoder's tokens ``ge``): ``step_of`` (groups + D slots, -1 where
    in no step yet), the groups left over (``rest``, fewer than D) and the number of full
    steps. Groups sort by the other encoders' loads in coarse levels, then ``gv``, ``gt``,
    ``gct`` (stable: ties keep group order); runs of D form the steps, shuffled by ``rng``."""
    n_groups = gv.shape[0]
    order = np.lexsort((gct, gt, gv, *[coarse(x) for x in ge[::-1]]))
    n_full = n_groups // d
    full = order[: n_full * d].reshape(n_full, d)
    step_of = np.full(n_groups + d, -1, dtype=np.int64)
    perm = rng.permutation(n_full)
    step_of[full[perm].ravel()] = np.repeat(np.arange(n_full), d)
    return step_of, order[n_full * d :], n_full


def last_step_bins(
    members: np.ndarray, costs: list[np.ndarray], means: list[float], d: int
) -> np.ndarray:
    """The final step's group (0..D-1) of each sample of the dissolved groups: LPT by their
    modeled costs, each phase's ``costs`` over its mean over all samples (``means``), heaviest
    first, ties by ``members`` (the samples' indices in the table)."""
    w = np.zeros(members.size)
    for c, m in zip(costs, means, strict=True):
        w = w + c / max(m, 1e-12)
    order_m = np.lexsort((members, -w))
    bins = np.empty(members.size, dtype=np.int64)
    _nb_lpt_capped(w, order_m, d, 0, 0.0, w, bins)
    return bins


def steps_of(step_of: np.ndarray, n_steps: int, d: int) -> np.ndarray:
    """[steps, D]: each step's groups (groups in no step left out), in group order."""
    placed = np.flatnonzero(step_of >= 0)
    return placed[_nb_counting_argsort(step_of[placed], n_steps)].reshape(n_steps, d)


def place_steps(
    sums: list[np.ndarray], by_step: np.ndarray, *, nodes: int, gpus_per_node: int
) -> tuple[np.ndarray, np.ndarray]:
    """(node, local rank) of every group (-1: in no step): each step's groups placed so that
    every node's load is even in every phase; ``sums``: each phase's per-group tokens (normalized
    here so that all phases weigh alike)."""
    n_steps, d = by_step.shape
    placing = np.empty((n_steps, d, len(sums)))
    for j, x in enumerate(sums):
        placing[:, :, j] = x[by_step] / max(x.mean(), 1e-12)
    node_s = np.empty((n_steps, d), dtype=np.int64)
    local_s = np.empty((n_steps, d), dtype=np.int64)
    _nb_place_on_nodes(placing, nodes, gpus_per_node, node_s, local_s)
    total = sums[0].shape[0]
    node = np.full(total, -1, dtype=np.int64)
    local = np.full(total, -1, dtype=np.int64)
    node[by_step.ravel()] = node_s.ravel()
    local[by_step.ravel()] = local_s.ravel()
    return node, local


def assign_steps(
    group_of: np.ndarray,
    n_groups: int,
    loads: dict[str, np.ndarray],
    *,
    nodes: int,
    gpus_per_node: int,
    rng: np.random.Generator,
    extra: tuple[tuple[str, str], ...] = (),
    caps: np.ndarray | None = None,
) -> StepAssignment:
    """Assign groups to steps and (node, local rank).

    ``loads`` holds per-sample ``vit_tokens``, ``llm_tokens``, ``vit_cost``, ``llm_cost`` and,
    for each other encoder phase, the (tokens, cost) keys ``extra`` names (``audio_tokens``,
    ``audio_cost``). ``caps``: every phase's token cap (vision, the others, LLM); given,
    each step's groups are refined in every phase (:func:`refine_steps`).
    """
    d = nodes * gpus_per_node
    gv = _group_sums(group_of, loads[VIT_TOKENS], n_groups)
    gt = _group_sums(group_of, loads[LLM_TOKENS], n_groups)
    gct = _group_sums(group_of, loads["llm_cost"], n_groups)
    ge = [_group_sums(group_of, loads[tokens], n_groups) for tokens, _ in extra]
    step_of, rest, n_steps = order_steps(gv, gt, gct, ge, d, rng)
    group_of = group_of.copy()
    last = np.empty(0, dtype=np.int64)
    if rest.size:
        # Dissolve the remaining groups; LPT their samples over D new groups (the final step).
        dissolved = np.zeros(n_groups, dtype=np.bool_)
        dissolved[rest] = True
        members = np.flatnonzero(dissolved[group_of])
        costs = ("vit_cost", *(cost for _, cost in extra), "llm_cost")
        bins = last_step_bins(
            members,
            [loads[k][members] for k in costs],
            [loads[k].mean() for k in costs],
            d,
        )
        last = n_groups + np.arange(d)
        group_of[members] = last[bins]
        step_of[last] = n_steps
        n_steps += 1
    total = n_groups + (d if rest.size else 0)
    by_step = steps_of(step_of[:total], n_steps, d)
    keys = (VIT_TOKENS, *(tokens for tokens, _ in extra), LLM_TOKENS)
    if caps is not None:
        x = per_sample([loads[k] for k in keys])
        group_of = refine_steps(group_of, step_of, by_step, x, caps)
        group_of = clear_sparse_steps(group_of, by_step, x, caps, total)
    node, local = place_steps(
        [_group_sums(group_of, loads[key], total) for key in keys],
        by_step,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
    )
    return StepAssignment(
        group_of=group_of,
        step=step_of[:total],
        node=node,
        local_rank=local,
        n_steps=n_steps,
        last_step_groups=last,
    )
