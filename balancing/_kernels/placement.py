"""Placement kernels: groups onto (node, rank) offline, and the runtime node-wise assignment that
keeps traffic inside nodes.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _nb_place_on_nodes(loads, nodes, per_node, node_out, local_out):
    """Place each step's D = nodes*per_node groups on (node, local rank).

    ``loads`` has shape (steps, D, phases), each phase normalized so all weigh alike. Groups go,
    heaviest (summed over the phases) first, to the node whose running load (the largest of its
    phases after adding the group) stays lowest, among nodes with a free slot: every node's
    total is as even as possible in every phase.
    """
    steps, d, k = loads.shape
    for s in range(steps):
        key = np.zeros(d)
        for g in range(d):
            for j in range(k):
                key[g] += loads[s, g, j]
        idx = np.argsort(-key, kind="mergesort")
        acc = np.zeros((nodes, k))
        used = np.zeros(nodes, dtype=np.int64)
        for p in range(d):
            gidx = idx[p]
            best = -1
            best_val = np.inf
            for nd in range(nodes):
                if used[nd] < per_node:
                    val = -np.inf
                    for j in range(k):
                        val = max(val, acc[nd, j] + loads[s, gidx, j])
                    if val < best_val:
                        best_val = val
                        best = nd
            node_out[s, gidx] = best
            local_out[s, gidx] = used[best]
            used[best] += 1
            for j in range(k):
                acc[best, j] += loads[s, gidx, j]


@njit(cache=True)
def _nb_local_first(lengths, order, src, d, per_node, target, dest):
    """Locality-first post-balancing: every rank keeps its own items (largest first, skipping
    those that would pass ``target``), overflow goes to the lightest rank of the same node that
    stays within ``target``, and what is left goes LPT-wise to the lightest rank anywhere."""
    n = order.shape[0]
    loads = np.zeros(d)
    pending = np.empty(n, dtype=np.int64)
    n_pending = 0
    for k in range(n):  # 1. keep at home
        i = order[k]
        r = src[i]
        if loads[r] == 0 or loads[r] + lengths[i] <= target:
            dest[i] = r
            loads[r] += lengths[i]
        else:
            pending[n_pending] = i
            n_pending += 1
    rest = np.empty(n_pending, dtype=np.int64)
    n_rest = 0
    for k in range(n_pending):  # 2. inside the node
        i = pending[k]
        base = (src[i] // per_node) * per_node
        best = -1
        for r in range(base, base + per_node):
            if loads[r] + lengths[i] <= target and (best < 0 or loads[r] < loads[best]):
                best = r
        if best >= 0:
            dest[i] = best
            loads[best] += lengths[i]
        else:
            rest[n_rest] = i
            n_rest += 1
    for k in range(n_rest):  # 3. anywhere: the lightest rank
        i = rest[k]
        best = 0
        for r in range(1, d):
            if loads[r] < loads[best]:
                best = r
        dest[i] = best
        loads[best] += lengths[i]
    return loads


@njit(cache=True)
def _nb_greedy_node_assign(benefit, per_node, node_of_batch):
    """Assign d batches to nodes (``per_node`` each), highest retained volume first."""
    d, nodes = benefit.shape
    flat = np.argsort(-benefit.ravel(), kind="mergesort")
    used = np.zeros(nodes, dtype=np.int64)
    node_of_batch[:] = -1
    placed = 0
    for f in flat:
        j = f // nodes
        nd = f % nodes
        if node_of_batch[j] < 0 and used[nd] < per_node:
            node_of_batch[j] = nd
            used[nd] += 1
            placed += 1
            if placed == d:
                break
    return placed
