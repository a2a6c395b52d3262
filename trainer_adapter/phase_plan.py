"""Where each item of a phase goes: the plan behind :func:`trainer_adapter.redistribute` and
:func:`trainer_adapter.plan_items`, the same on every rank (identical inputs, deterministic
kernels). A phase's items are balanced over the phase's ranks with ``balancing``'s runtime
methods (or kept where they are: balancing off, already even within ``min_gain``, or no
gain), then placed node-wise (OrchMLLM Alg. 3) so that most bytes that move stay inside a node;
a dry run plans as balancing would and moves nothing.
"""

from __future__ import annotations

import numpy as np

from balancing import locality_balance, nodewise_permutation, post_balance
from balancing.post_balance import LOCALITY, MemoryCapError
from trainer_adapter.topology import Topology

__all__ = ["phase_index", "plan_phase"]


def _per_node(ranks: tuple[int, ...], topo: Topology) -> int | None:
    """Ranks of the phase per node, when they split into whole, equal, consecutive nodes."""
    nodes = np.array([topo.node_of(r) for r in ranks])
    uniq, counts = np.unique(nodes, return_counts=True)
    if len(set(counts.tolist())) != 1 or not np.array_equal(nodes, np.repeat(uniq, counts[0])):
        return None
    return int(counts[0])


def _extra_sources(extra, ranks, topo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item, phase-rank index, bytes) of payload that reaches an item's destination from
    another rank than its own (an image's embeddings from its encoder rank): each source is
    stood in for by a rank of this phase on the same node (the node is what the placement
    weighs); sources on nodes without such a rank are left out."""
    e_src, e_bytes = extra
    on_node = {}
    for j, r in enumerate(ranks):
        on_node.setdefault(topo.node_of(r), j)
    where = {r: j for j, r in enumerate(ranks)}
    idx = np.array(
        [where.get(int(r), on_node.get(topo.node_of(int(r)), -1)) if r >= 0 else -1 for r in e_src],
        dtype=np.int64,
    )
    ok = np.flatnonzero((idx >= 0) & (e_bytes > 0))
    return ok, idx[ok], e_bytes[ok].astype(np.float64)


def plan_phase(cost, src, ranks, topo, policy, volume, cap=None, traffic=None):
    """Destination rank of each item, the method that ran, the loads of the phase's ranks
    before, and the loads the plan gives. Under ``policy.dry_run`` every item stays on its rank
    (the plan's loads are what it would have given; a plan the memory cap refuses, the loads
    before, the method saying why)."""
    if policy.dry_run:
        outside = np.setdiff1d(src, ranks).tolist()
        if outside:
            raise ValueError(
                f"dry_run keeps every item on its rank, but ranks {outside} hold items and take "
                f"no part in this phase (its ranks: {tuple(ranks)}); dry-run a topology whose "
                "phases run on every rank"
            )
    try:
        dest, method, before = _plan(cost, src, ranks, topo, policy, volume, cap, traffic)
    except MemoryCapError as e:  # a dry run measures: no plan under the cap is a finding
        if not policy.dry_run:
            raise
        dest, method = np.asarray(src, dtype=np.int64), f"no plan under the memory cap: {e}"
        before = np.bincount(phase_index(dest, ranks), weights=cost, minlength=len(ranks))
    planned = np.bincount(phase_index(dest, ranks), weights=cost, minlength=len(ranks))
    if not policy.dry_run:
        return dest, method, before, planned
    return np.asarray(src, dtype=np.int64).copy(), f"dry run ({method})", before, planned


def phase_index(r: np.ndarray, ranks) -> np.ndarray:
    """Each of ``r`` (ranks of the phase) as its place in ``ranks``."""
    r = np.asarray(r, dtype=np.int64)
    lut = np.full(max(max(ranks), int(r.max(initial=0))) + 1, -1, dtype=np.int64)
    lut[list(ranks)] = np.arange(len(ranks))
    return lut[r]


def _plan(cost, src, ranks, topo, policy, volume, cap=None, traffic=None):
    """Destination rank of each item and the method that ran, and the loads before. ``traffic``
    (bytes per item from its own rank, and a list of (source rank, bytes) per item from
    elsewhere: each encoder phase's outputs) is what the node-wise placement keeps inside
    nodes; by default ``volume`` from the item's rank."""
    ranks_arr = np.asarray(ranks, dtype=np.int64)
    where = {r: j for j, r in enumerate(ranks)}
    src_j = np.array([where.get(int(s), -1) for s in src], dtype=np.int64)
    d = len(ranks)
    before = np.bincount(src_j[src_j >= 0], weights=cost[src_j >= 0], minlength=d)
    identity_ok = bool((src_j >= 0).all())
    if not policy.enabled or src.size == 0:
        if not identity_ok:
            raise ValueError(
                f"redistribution is off but ranks {sorted(set(src[src_j < 0].tolist()))} hold "
                f"samples and take no part in this phase (its ranks: {ranks})"
            )
        return ranks_arr[src_j] if src.size else src.copy(), "identity", before
    # keeping the ranks' own items is an option only where it holds the memory cap
    mem = volume if volume is not None else cost
    fits = identity_ok and (not cap or np.bincount(src_j, weights=mem, minlength=d).max() <= cap)
    if fits and before.mean() > 0 and before.max() <= before.mean() * (1 + policy.min_gain):
        return ranks_arr[src_j], "kept (within min_gain)", before
    per_node = _per_node(ranks, topo)
    if policy.method == LOCALITY and identity_ok:
        pb = locality_balance(cost, src_j, d, per_node or d)
        if not cap or np.bincount(pb.dest, weights=mem, minlength=d).max() <= cap:
            return ranks_arr[pb.dest], pb.method, before
        # locality moves only the excess and cannot see a memory cap: the capped plan instead
    method = "lpt" if policy.method == LOCALITY else policy.method
    pb = post_balance(cost, d, method=method, memory_cap=cap, memory=volume if cap else None)
    if fits and pb.loads.max() >= before.max():
        return ranks_arr[src_j], f"kept ({pb.method} would not lower the max)", before
    batch_rank = np.arange(d)
    name = pb.method
    if policy.placement == "nodewise" and identity_ok and per_node is not None:
        items, dests, weights = src_j, pb.dest, volume.astype(np.float64)
        if traffic is not None:  # each encoder phase's outputs, from its encoder ranks
            own, extras = traffic
            parts = [_extra_sources(extra, ranks, topo) for extra in extras]
            items = np.concatenate([src_j, *(e for _, e, _ in parts)])
            dests = np.concatenate([pb.dest, *(pb.dest[k] for k, _, _ in parts)])
            weights = np.concatenate([np.asarray(own, dtype=np.float64), *(b for _, _, b in parts)])
        nw = nodewise_permutation(items, dests, weights, d, per_node)
        batch_rank = nw.rank_of_batch
        name += f" + {nw.method}"
    return ranks_arr[batch_rank[pb.dest]], name, before
