"""Node-wise rearrangement (OrchMLLM §5.2.2): keep the samples that move inside a node.

After post-balancing, the d new batches can be placed on the d ranks in any order without
changing balance. ``nodewise_permutation`` (Alg. 3) picks the order that minimizes the largest
inter-node volume any rank sends: exactly with scipy's ``milp`` (HiGHS) for small d, greedily by
retained volume for large d; inside a node, batches go to the rank that already holds most of
them (``linear_sum_assignment``). Batches made by LPT are mixtures of every rank, which leaves
little to keep; ``locality_balance`` therefore balances *with* locality — ranks keep their own
samples up to the balanced load, overflow stays in the node when it can — and then refines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from balancing import first_call, twins
from balancing._kernels.partition import _nb_argsort_desc
from balancing._kernels.placement import _nb_greedy_node_assign, _nb_local_first
from balancing._kernels.refine import _nb_refine
from balancing.checks import MAX_MATRIX_RANKS, finite_nonnegative, rank_count, ranks_in
from balancing.post_balance import LOCALITY, PostBalance, post_balance

__all__ = [
    "NodewiseResult",
    "inter_node_volume",
    "locality_balance",
    "nodewise_permutation",
    "volume_matrix",
]


@dataclass(frozen=True, slots=True)
class NodewiseResult:
    """``rank_of_batch[j]``: the rank that gets new batch j. Volumes are before/after it."""

    rank_of_batch: np.ndarray
    method: str
    inter_node_identity: float
    inter_node: float
    max_rank_inter_node_identity: float
    max_rank_inter_node: float

    @property
    def reduction(self) -> float:
        """Fraction of the identity placement's inter-node volume that is saved."""
        return (
            1.0 - self.inter_node / self.inter_node_identity
            if self.inter_node_identity > 0
            else 0.0
        )


def volume_matrix(src: np.ndarray, dest: np.ndarray, volume: np.ndarray, d: int) -> np.ndarray:
    """V[i, j]: volume that rank i sends to new batch j."""
    d = rank_count(d, "d (ranks)", MAX_MATRIX_RANKS)
    return np.bincount(
        np.asarray(src) * d + np.asarray(dest), weights=volume, minlength=d * d
    ).reshape(d, d)


def inter_node_volume(
    v: np.ndarray, rank_of_batch: np.ndarray, per_node: int
) -> tuple[float, float]:
    """(total, largest per source rank) volume crossing nodes when batch j goes to rank_of_batch[j]."""
    d = v.shape[0]
    src_node = np.arange(d) // per_node
    dst_node = np.asarray(rank_of_batch) // per_node
    cross = src_node[:, None] != dst_node[None, :]
    per_rank = (v * cross).sum(axis=1)
    return float(per_rank.sum()), float(per_rank.max()) if d else 0.0


def _exact_nodes(v: np.ndarray, per_node: int) -> np.ndarray | None:
    """The node of each batch minimizing the largest inter-node volume any rank sends (a MILP),
    or None when the solver gives no assignment in its time limit. The volumes are scaled to
    at most 1 first: byte counts of 1e11 and more (squared token costs) made HiGHS call a
    feasible problem infeasible, and a training step failed with it."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    v = v / max(float(v.max(initial=0.0)), 1e-300)
    d = v.shape[0]
    nodes = d // per_node
    nx = d * nodes  # x[j, n] at j * nodes + n, then z
    out = v.sum(axis=1)
    rows, cols, vals = [], [], []
    r = 0
    for j in range(d):  # each batch on one node
        rows += [r] * nodes
        cols += [j * nodes + n for n in range(nodes)]
        vals += [1.0] * nodes
        r += 1
    for n in range(nodes):  # each node takes per_node batches
        rows += [r] * d
        cols += [j * nodes + n for j in range(d)]
        vals += [1.0] * d
        r += 1
    eq = coo_matrix((vals, (rows, cols)), shape=(r, nx + 1))
    rows, cols, vals = [], [], []
    for i in range(d):  # out_i - sum_j V[i, j] x[j, node(i)] <= z
        ni = i // per_node
        for j in range(d):
            if v[i, j]:
                rows.append(i)
                cols.append(j * nodes + ni)
                vals.append(-v[i, j])
        rows.append(i)
        cols.append(nx)
        vals.append(-1.0)
    ub = coo_matrix((vals, (rows, cols)), shape=(d, nx + 1))
    c = np.zeros(nx + 1)
    c[nx] = 1.0
    scale = max(v.sum(), 1.0)
    for j in range(d):  # tie-break: keep as much volume in its node as possible
        for n in range(nodes):
            c[j * nodes + n] = -1e-6 * v[n * per_node : (n + 1) * per_node, j].sum() / scale
    res = milp(
        c,
        constraints=[
            LinearConstraint(
                eq,
                np.r_[np.ones(d), np.full(nodes, per_node)],
                np.r_[np.ones(d), np.full(nodes, per_node)],
            ),
            LinearConstraint(ub, -np.inf, -out),
        ],
        integrality=np.r_[np.ones(nx), 0],
        bounds=Bounds(np.zeros(nx + 1), np.r_[np.ones(nx), np.inf]),
        options={"time_limit": 1.0},
    )
    if res.x is None:
        return None
    return np.asarray(res.x[:nx]).reshape(d, nodes).argmax(axis=1)


@first_call.entry_point
def nodewise_permutation(
    src: np.ndarray,
    dest: np.ndarray,
    volume: np.ndarray,
    d: int,
    per_node: int,
    *,
    exact_max_d: int = 16,
) -> NodewiseResult:
    """Choose which rank receives each new batch (Alg. 3); see the module docstring."""
    from scipy.optimize import linear_sum_assignment

    d = rank_count(d, "d (ranks)", MAX_MATRIX_RANKS)
    per_node = rank_count(per_node, "per_node (ranks per node)", d)
    if d % per_node:
        raise ValueError(f"d={d} ranks must split into whole nodes of {per_node}")
    volume = finite_nonnegative(volume, "volume")
    src = ranks_in(src, d, "src", volume.size)
    dest = ranks_in(dest, d, "dest", volume.size)
    v = volume_matrix(src, dest, volume, d)
    nodes = d // per_node
    if nodes == 1:
        node_of = np.zeros(d, dtype=np.int64)
        method = "single-node"
    elif d <= exact_max_d and (node_of := _exact_nodes(v, per_node)) is not None:
        method = "milp"
    else:  # many ranks, or a MILP without an answer in its time limit
        benefit = v.reshape(nodes, per_node, d).sum(axis=1).T.copy()  # [batch, node]
        if first_call.kernels_ready():
            node_of = np.empty(d, dtype=np.int64)
            _nb_greedy_node_assign(benefit, per_node, node_of)
        else:  # its exact twin while the kernels compile
            node_of = twins.greedy_node_assign(benefit, per_node)
        method = "greedy"
    rank_of = np.empty(d, dtype=np.int64)
    for n in range(nodes):
        batches = np.flatnonzero(node_of == n)
        ranks = np.arange(n * per_node, (n + 1) * per_node)
        rows, cols = linear_sum_assignment(-v[np.ix_(ranks, batches)])
        rank_of[batches[cols]] = ranks[rows]
    ident = np.arange(d)
    tot0, max0 = inter_node_volume(v, ident, per_node)
    tot1, max1 = inter_node_volume(v, rank_of, per_node)
    if max1 > max0 or (max1 == max0 and tot1 > tot0):  # never worse than leaving batches in place
        rank_of, tot1, max1, method = ident, tot0, max0, method + " (identity kept)"
    return NodewiseResult(rank_of, method, tot0, tot1, max0, max1)


@first_call.entry_point
def locality_balance(
    lengths: np.ndarray,
    src: np.ndarray,
    d: int,
    per_node: int,
    *,
    tolerance: float = 2e-5,
    max_loss: float = 0.005,
) -> PostBalance:
    """Balance ``lengths`` over d ranks moving as little as possible, and inside nodes first.

    ``src[i]`` is the rank that holds item i now. The result's ``dest`` are ranks. Ranks keep
    their own items up to the mean load, then the refinement evens the rest. ``max_loss``: how
    much heavier than :func:`post_balance`'s heaviest rank the result's may be (checked only
    when the plan's heaviest is above the mean by more than that). Beyond it, ranks keep their
    items up to post_balance's heaviest load instead; failing that too, post_balance's batches
    are placed on the ranks by :func:`nodewise_permutation` (most of each batch's volume stays
    in its node). ``method`` says which plan was taken.
    """
    d = rank_count(d, "d (ranks)", MAX_MATRIX_RANKS)
    per_node = rank_count(per_node, "per_node (ranks per node)", d)
    if d % per_node:
        raise ValueError(f"d={d} ranks must split into whole nodes of {per_node}")
    if not (np.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be finite and >= 0, got {tolerance!r}")
    if not (np.isfinite(max_loss) and max_loss >= 0):
        raise ValueError(f"max_loss must be finite and >= 0, got {max_loss!r}")
    x = finite_nonnegative(lengths)
    src = ranks_in(src, d, "src", x.size)
    mean = x.sum() / d
    target = mean * (1.0 + tolerance)
    py = not first_call.kernels_ready()  # exact twins while the kernels compile
    order = twins.argsort_desc(x) if py else _nb_argsort_desc(x)
    dest, loads = _local(x, order, src, d, per_node, target, target, py)
    if not x.size or loads.max() <= mean * (1.0 + max_loss):
        return PostBalance(dest=dest, loads=loads, method=LOCALITY)
    pb = post_balance(x, d, tolerance=tolerance)
    bound = pb.loads.max() * (1.0 + max_loss)
    if loads.max() <= bound:
        return PostBalance(dest=dest, loads=loads, method=LOCALITY)
    dest, loads = _local(x, order, src, d, per_node, pb.loads.max(), target, py)
    if loads.max() <= bound:
        return PostBalance(dest=dest, loads=loads, method="locality (kept up to post_balance's)")
    dest = nodewise_permutation(src, pb.dest, x, d, per_node).rank_of_batch[pb.dest]
    return PostBalance(dest=dest, loads=np.bincount(dest, weights=x, minlength=d), method=(
        f"{pb.method} + nodewise (locality above post_balance by more than max_loss)"
    ))  # fmt: skip


def _local(x, order, src, d: int, per_node: int, keep: float, target: float, py: bool):
    """Ranks keep their items up to ``keep``, the overflow goes inside the node first, then
    the refinement lowers the heaviest toward ``target``: (dest, loads)."""
    if py:
        dest = twins.local_first(x, order, src, d, per_node, keep)
        return dest, twins.refine(x, order, dest, d, target, 4 * d, 0.0, x, 0, True)
    dest = np.empty(x.size, dtype=np.int64)
    _nb_local_first(x, order, src, d, per_node, keep, dest)
    return dest, _nb_refine(x, order, dest, d, target, 4 * d, 0.0, x, 0, True)
