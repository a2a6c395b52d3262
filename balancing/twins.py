"""Exact pure-Python twins of the runtime kernels: what the entry points run until numba has
compiled the kernels (:mod:`balancing.first_call`). Each takes the kernel's steps in the kernel's
order, every float computed as the kernel does, so that the plan is the same to the bit on every
rank whichever path a rank took (checked against the kernels over many seeds in the tests)."""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from balancing import _reference as R

__all__ = [
    "argsort_desc",
    "greedy_node_assign",
    "karmarkar_karp",
    "local_first",
    "lower_bound",
    "lpt",
    "refine",
    "second_opinion",
]


def argsort_desc(x: np.ndarray) -> np.ndarray:
    """``_nb_argsort_desc``: indices sorting ``x`` descending, ties by index."""
    return np.argsort(-x, kind="stable").astype(np.int64)


def lpt(x: np.ndarray, order: np.ndarray, d: int) -> np.ndarray:
    """``_nb_lpt``: each item onto the least-loaded bin, ties to the lowest bin."""
    dest = np.zeros(x.size, dtype=np.int64)
    heap = [(0.0, b) for b in range(d)]
    xs = x.tolist()
    for i in order.tolist():
        load, b = heap[0]
        dest[i] = b
        heapq.heapreplace(heap, (load + xs[i], b))
    return dest


def karmarkar_karp(x: np.ndarray, order: np.ndarray, d: int, equal: bool) -> np.ndarray:
    """``_nb_karmarkar_karp`` (the reference's merge order and ties)."""
    got = R.karmarkar_karp(x.tolist(), order.tolist(), d, equal)
    return np.array([got[i] for i in range(x.size)], dtype=np.int64)


def local_first(x, order, src, d, per_node, target) -> np.ndarray:
    """``_nb_local_first``: home while under ``target``, then the node's lightest rank that
    stays under it, then the lightest rank anywhere (the lowest on a tie)."""
    xs, src_l = x.tolist(), src.tolist()
    loads = [0.0] * d
    dest = np.empty(len(xs), dtype=np.int64)
    pending, rest = [], []
    for i in order.tolist():
        r = src_l[i]
        if loads[r] == 0 or loads[r] + xs[i] <= target:
            dest[i] = r
            loads[r] += xs[i]
        else:
            pending.append(i)
    for i in pending:
        base = (src_l[i] // per_node) * per_node
        fits = [r for r in range(base, base + per_node) if loads[r] + xs[i] <= target]
        if fits:
            r = min(fits, key=lambda r: (loads[r], r))
            dest[i] = r
            loads[r] += xs[i]
        else:
            rest.append(i)
    heap = [(loads[r], r) for r in range(d)]
    heapq.heapify(heap)
    for i in rest:
        r = _top(heap, loads, 1.0)
        dest[i] = r
        loads[r] += xs[i]
        heapq.heappush(heap, (loads[r], r))
    return dest


def _pair_step(xs, items, lens, a, b, gap, moves, width, cap, cm, mem):
    """``balancing._kernels.refine._pair_step`` over per-bin ascending lists."""
    half = gap / 2
    best_pa, best_pb, best_err = -1, -1, np.inf
    ib_items, ib_lens = items[b], lens[b]
    nb = len(ib_items)
    can_move = moves and nb < width
    lo = 0
    for pa, ia in enumerate(items[a]):
        x = xs[ia]
        if can_move and 0 < x < gap and (cap <= 0 or mem[b] + cm[ia] <= cap):
            err = abs(x - half)
            if err < best_err:
                best_err, best_pa, best_pb = err, pa, -1
        want = x - half
        while lo < nb and ib_lens[lo] < want:
            lo += 1
        for c in (lo - 1, lo):
            if 0 <= c < nb:
                ib = ib_items[c]
                delta = x - xs[ib]
                if 0 < delta < gap:
                    if cap > 0:
                        dm = cm[ia] - cm[ib]
                        if mem[b] + dm > cap or mem[a] - dm > cap:
                            continue
                    err = abs(delta - half)
                    if err < best_err:
                        best_err, best_pa, best_pb = err, pa, c
    return best_pa, best_pb


def _top(heap: list, loads: list, sign: float) -> int:
    """The bin on top of a lazy heap of (sign * load, bin), dropping entries a later load made
    stale: the least (sign 1) or most (sign -1) loaded bin, the lowest index on a tie."""
    while heap[0][0] != sign * loads[heap[0][1]]:
        heapq.heappop(heap)
    return heap[0][1]


def refine(x, order, bins, d, target, max_steps, cap, cap_lengths, max_count, moves):
    """``_nb_refine``, the same steps in the same order (every float computed as it does).
    Updates ``bins``; returns the loads."""
    xs, cm, order_l = x.tolist(), cap_lengths.tolist(), order.tolist()
    n = len(xs)
    b_of = bins.tolist()
    if x.dtype == np.float64 and cap_lengths.dtype == np.float64 and bins.size:
        # numpy's weighted bincount adds in index order from 0.0, as the loop below does
        loads = np.bincount(bins, weights=x, minlength=d).tolist()
        mem = np.bincount(bins, weights=cap_lengths, minlength=d).tolist()
        cnt = np.bincount(bins, minlength=d).tolist()
    else:
        loads, mem, cnt = [0.0] * d, [0.0] * d, [0] * d
        for i in range(n):
            loads[b_of[i]] += xs[i]
            mem[b_of[i]] += cm[i]
            cnt[b_of[i]] += 1
    top = max(cnt) if d > 0 else 0
    width = top + max(4, top // 2)
    if max_count > 0:
        width = max(top, min(width, max_count))
    # each bin's items in ascending order (the reverse of ``order``), their ranks in it
    asc = order[::-1]
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[asc] = np.arange(n)
    rank = rank_of.tolist()
    ascending = x[asc].tolist()
    grouped = asc[np.argsort(bins[asc], kind="stable")]
    starts = np.concatenate(([0], np.cumsum(cnt))).tolist()
    items = [grouped[starts[c] : starts[c + 1]].tolist() for c in range(d)]
    lens = [[xs[i] for i in items[c]] for c in range(d)]
    lightest = [(loads[b], b) for b in range(d)]
    heaviest = [(-loads[b], b) for b in range(d)]
    heapq.heapify(lightest)
    heapq.heapify(heaviest)
    val = None  # load of the item's bin - its length, in ascending rank (the kernel's tree)
    for _ in range(max_steps):
        a = _top(heaviest, loads, -1.0)
        if loads[a] <= target:
            break
        b = _top(lightest, loads, 1.0)
        args = (moves, width, cap, cm, mem)
        pa, pb = _pair_step(xs, items, lens, a, b, loads[a] - loads[b], *args)
        if pa < 0:
            if val is None:
                val = np.empty(n)
                val[rank_of] = np.asarray(loads)[np.asarray(b_of, dtype=np.int64)] - x
            slack = 0.0
            # prefix minima of val and, for each, the first leaf holding it (the tree's answer)
            top_q = bisect.bisect_left(ascending, xs[items[a][-1]]) if items[a] else 0
            run_min = np.minimum.accumulate(val[:top_q])
            neg = -run_min
            for ia in reversed(items[a]):
                xa = xs[ia]
                q = bisect.bisect_left(ascending, xa)
                if q == 0:
                    continue
                best = float(run_min[q - 1])
                if loads[a] - xa - best > slack:
                    slack = loads[a] - xa - best
                    leaf = int(np.searchsorted(neg, -best, side="left"))
                    b = b_of[order_l[n - 1 - leaf]]
            if slack > 0:
                pa, pb = _pair_step(xs, items, lens, a, b, loads[a] - loads[b], *args)
        if pa < 0 and (cap > 0 or max_count > 0):
            for b in sorted(range(d), key=lambda c: (loads[c], c)):
                if loads[b] >= loads[a]:
                    break
                pa, pb = _pair_step(xs, items, lens, a, b, loads[a] - loads[b], *args)
                if pa >= 0:
                    break
        if pa < 0:
            break
        ia = items[a].pop(pa)
        lens[a].pop(pa)
        delta = xs[ia]
        dm = cm[ia]
        if pb >= 0:
            ib = items[b].pop(pb)
            lens[b].pop(pb)
            p = bisect.bisect_right(lens[a], xs[ib])
            items[a].insert(p, ib)
            lens[a].insert(p, xs[ib])
            b_of[ib] = a
            delta -= xs[ib]
            dm -= cm[ib]
        p = bisect.bisect_right(lens[b], xs[ia])
        items[b].insert(p, ia)
        lens[b].insert(p, xs[ia])
        b_of[ia] = b
        loads[a] -= delta
        loads[b] += delta
        mem[a] -= dm
        mem[b] += dm
        for c in (a, b):
            heapq.heappush(lightest, (loads[c], c))
            heapq.heappush(heaviest, (-loads[c], c))
            if val is not None:
                for i in items[c]:
                    val[rank[i]] = loads[c] - xs[i]
    bins[:] = b_of
    return np.array(loads)


def lower_bound(x: np.ndarray, order: np.ndarray, d: int) -> float:
    """``_nb_lower_bound``: the mean, the largest item, and for each k the k + 1 lightest of the
    k * d + 1 heaviest items; every sum heaviest first, one item after another (``cumsum``)."""
    xs = x[order]
    if not xs.size:
        return 0.0
    cs = np.concatenate(([0.0], np.cumsum(xs)))
    lb = max(float(cs[-1]) / d, float(xs[0]))
    k = np.arange(1, (xs.size - 1) // d + 1)
    if k.size:
        lb = max(lb, float((cs[k * d + 1] - cs[k * d - k]).max()))
    return lb


def second_opinion(x, order, d, target, steps, kk, top, dest) -> tuple[int, np.ndarray, int]:
    """``_nb_second_opinion``: equal-count KK, the items kept home up to the mean, unequal KK
    (``kk``), each refined with moves and tried while the best so far is above ``target``; the
    first strictly more even than ``top`` wins. ``(code, loads, tried)``, the plan in ``dest``."""
    from balancing._kernels.auto import HOME, KEPT, KK, KK_EQUAL

    n = x.size
    code, tried, best = KEPT, 0, np.empty(0)
    opinions = [KK_EQUAL, HOME, KK] if kk else [KK_EQUAL, HOME]
    for k, opinion in enumerate(opinions):
        if k and top <= target:
            break
        if opinion == HOME:
            src = (np.arange(n, dtype=np.int64) * d) // n  # the ranks' items one after another
            cand = local_first(x, order, src, d, d, target)
        else:
            cand = karmarkar_karp(x, order, d, opinion == KK_EQUAL)
        loads = np.bincount(cand, weights=x, minlength=d)
        if opinion != KK or loads.max() > target:
            loads = refine(x, order, cand, d, target, steps, 0.0, x, 0, True)
        tried |= 1 << opinion
        if loads.max() < top:
            code, best, top = opinion, loads, loads.max()
            dest[:] = cand
    return code, best, tried


def greedy_node_assign(benefit: np.ndarray, per_node: int) -> np.ndarray:
    """``_nb_greedy_node_assign``: batches to nodes, the (batch, node) pair of highest benefit
    first (ties: row-major), at most ``per_node`` batches per node."""
    d, nodes = benefit.shape
    node_of = np.full(d, -1, dtype=np.int64)
    used = [0] * nodes
    left = d
    flat = benefit.ravel()
    # the pairs of positive benefit in the kernel's order; the rest (benefits are volumes, so
    # >= 0: zeros) follow in row-major order, which the loop below walks without sorting them
    # (a batch gets the first node with room): d x nodes pairs are 800k at d = 2560
    pos = np.flatnonzero(flat > 0) if (flat >= 0).all() else np.arange(flat.size)
    for p in pos[np.argsort(-flat[pos], kind="stable")].tolist():
        j, n = divmod(p, nodes)
        if node_of[j] < 0 and used[n] < per_node:
            node_of[j] = n
            used[n] += 1
            left -= 1
            if not left:
                return node_of
    n = 0
    for j in np.flatnonzero(node_of < 0).tolist():
        while used[n] >= per_node:
            n += 1
        node_of[j] = n
        used[n] += 1
    return node_of
