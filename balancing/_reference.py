"""Plain-Python twins of the numba kernels in ``balancing._kernels``, written for clarity, not speed.
Tests check that kernel and reference agree exactly over many seeds."""

from __future__ import annotations

import bisect
import heapq
import math


def isf_round(rows, q, qf):
    """-> (group_end list, kept list); see ``_nb_isf_round`` (each sample's loads, one per
    phase, in shuffled order)."""
    ends, kept = [], []
    sums = [0] * len(q)
    start = 0
    for k, row in enumerate(rows):
        if k > start and any(s + x > cap for s, x, cap in zip(sums, row, q, strict=True)):
            ends.append(k)
            kept.append(any(s >= f for s, f in zip(sums, qf, strict=True)))
            start, sums = k, [0] * len(q)
        sums = [s + x for s, x in zip(sums, row, strict=True)]
    if len(rows) > start:
        ends.append(len(rows))
        kept.append(any(s >= f for s, f in zip(sums, qf, strict=True)))
    return ends, kept


def apply_round(order, ends, kept, base):
    """-> ({sample: group id} of kept groups, [samples left] in order); see ``_nb_apply_round``."""
    group_of, rest = {}, []
    start, nk = 0, 0
    for end, keep in zip(ends, kept, strict=True):
        if keep:
            group_of.update({i: base + nk for i in order[start:end]})
            nk += 1
        else:
            rest.extend(order[start:end])
        start = end
    return group_of, rest


def best_fit(order, rows, q, window):
    """-> {item: group}; see ``_nb_best_fit`` (bounded-space best fit, every phase capped)."""
    if not order:
        return {}
    smallest = [min(rows[i][j] for i in order) for j in range(len(q))]
    sums: list[list[int]] = []
    open_ids: list[int] = []
    out = {}
    for i in order:
        best, best_slack = -1, len(q) + 1.0
        for g in open_ids:
            new = [s + x for s, x in zip(sums[g], rows[i], strict=True)]
            if all(x <= cap for x, cap in zip(new, q, strict=True)):
                slack = sum((cap - x) / cap for x, cap in zip(new, q, strict=True))
                if slack < best_slack:
                    best, best_slack = g, slack
        if best < 0:
            if len(open_ids) == window:
                open_ids.pop(0)
            best = len(sums)
            sums.append([0] * len(q))
            open_ids.append(best)
        sums[best] = [s + x for s, x in zip(sums[best], rows[i], strict=True)]
        out[i] = best
        if any(s + m > cap for s, m, cap in zip(sums[best], smallest, q, strict=True)):
            open_ids.remove(best)
    return out


def argsort_desc(x):
    return sorted(range(len(x)), key=lambda i: (-x[i], i))


def lpt(lengths, order, d):
    """-> {item: bin}: each item onto the least-loaded bin, ties to the lowest bin."""
    heap = [(0.0, b) for b in range(d)]
    out = {}
    for i in order:
        load, b = heapq.heappop(heap)
        out[i] = b
        heapq.heappush(heap, (load + lengths[i], b))
    return out


def lpt_capped(lengths, order, d, max_count, cap, cap_lengths):
    """-> ({item: bin}, first failing position or -1); see ``_nb_lpt_capped``."""
    loads = [0.0] * d
    mem = [0.0] * d
    counts = [0] * d
    out = {}
    for k, i in enumerate(order):
        free = [b for b in range(d) if max_count <= 0 or counts[b] < max_count]
        if not free:
            return out, k
        b = min(free, key=lambda c: (loads[c], c))
        if cap > 0 and mem[b] + cap_lengths[i] > cap:
            fits = [c for c in free if mem[c] + cap_lengths[i] <= cap]
            if not fits:
                return out, k
            b = min(fits, key=lambda c: (loads[c], c))
        loads[b] += lengths[i]
        mem[b] += cap_lengths[i]
        counts[b] += 1
        out[i] = b
    return out, -1


def lpt_quadratic(lengths, order, d, tolerance):
    """-> {item: bin}, OrchMLLM Alg. 4: each item (largest first) onto the batch its CMP puts on
    top: among the batches whose sums lie within ``tolerance`` of the lightest (lowest index on
    equal sums), the smallest sum of squares, the lightest itself where it has that smallest
    sum, else the lowest index."""
    lin = [0.0] * d
    sq = [0.0] * d
    out = {}
    for i in order:
        m = min(range(d), key=lambda b: (lin[b], b))
        tied = [b for b in range(d) if b == m or lin[b] - lin[m] < tolerance]
        b = min(tied, key=lambda c: (sq[c], c != m, c))
        lin[b] += lengths[i]
        sq[b] += lengths[i] * lengths[i]
        out[i] = b
    return out


def padded_attention(lengths, order, d, bound):
    """-> {item: bin}, OrchMLLM Alg. 5: items largest first fill padded batches in turn, a
    batch taking the next item while its padded size (count x its first, largest length; the
    paper's line 6 writes the new item's length, which in descending order never exceeds it)
    stays within ``bound``; once d batches are open, the rest go LPT onto the batch sums
    (lightest, lowest index on ties)."""
    batches: list[list[int]] = []
    k = 0
    for k, i in enumerate(order):  # noqa: B007 (k: where the padded phase stopped)
        last = batches[-1] if batches else None
        if last is None or (len(last) + 1) * lengths[last[0]] > bound:
            if len(batches) == d:
                break
            batches.append([])
        batches[-1].append(i)
    else:
        k = len(order)
    sums = [sum(lengths[i] for i in b) for b in batches] + [0.0] * (d - len(batches))
    out = {i: b for b, members in enumerate(batches) for i in members}
    for i in order[k:]:
        b = min(range(d), key=lambda c: (sums[c], c))
        out[i] = b
        sums[b] += lengths[i]
    return out


def karmarkar_karp(lengths, order, d, equal_count):
    """-> {item: subset}; see ``_nb_karmarkar_karp`` (same tie-breaking)."""
    n = len(order)
    if equal_count:
        parts = []
        for s in range(0, n, d):
            chunk = order[s : s + d]
            sub = [[lengths[i], [i]] for i in chunk] + [[0.0, []] for _ in range(d - len(chunk))]
            parts.append(sub)
    else:
        parts = [[[lengths[i], [i]]] + [[0.0, []] for _ in range(d - 1)] for i in order]
    parts = [sorted(p, key=lambda s: -s[0]) for p in parts]  # stable: keeps equal sums in order
    # max-heap on spread, ties by lower id (ids follow the kernel's slot reuse)
    heap = [(-(p[0][0] - p[-1][0]), k) for k, p in enumerate(parts)]
    heapq.heapify(heap)
    while len(heap) > 1:
        _, a = heapq.heappop(heap)
        _, b = heapq.heappop(heap)
        merged = [
            [parts[a][j][0] + parts[b][d - 1 - j][0], parts[a][j][1] + parts[b][d - 1 - j][1]]
            for j in range(d)
        ]
        parts[b] = sorted(merged, key=lambda s: -s[0])
        heapq.heappush(heap, (-(parts[b][0][0] - parts[b][-1][0]), b))
    root = parts[heap[0][1]]
    return {i: j for j, (_, items) in enumerate(root) for i in items}


def padded_batches(sorted_asc, d):
    """-> (bound, [run of each position]); see ``_nb_padded_batches``."""
    import math

    n = len(sorted_asc)
    if n == 0:
        return 0.0, []

    lo, hi = sorted_asc[-1], sorted_asc[-1] * (n // d + 1)
    while lo < hi:
        mid = math.floor((lo + hi) / 2)
        runs, cnt = 1, 0
        for x in sorted_asc:
            if (cnt + 1) * x > mid:
                runs += 1
                cnt = 0
            cnt += 1
        if runs <= d:
            hi = mid
        else:
            lo = mid + 1
    out, run, cnt = [], 0, 0
    for x in sorted_asc:
        if (cnt + 1) * x > lo:
            run += 1
            cnt = 0
        cnt += 1
        out.append(run)
    return lo, out


def group_stats(ids, v, t, vc, tc, n_groups):
    """-> list of [count, sum v, sum t, sum vc, sum tc, max v, max t] per group."""
    out = [[0.0] * 7 for _ in range(n_groups)]
    for g, a, b, c, d in zip(ids, v, t, vc, tc, strict=True):
        row = out[g]
        row[0] += 1
        row[1] += a
        row[2] += b
        row[3] += c
        row[4] += d
        row[5] = max(row[5], a)
        row[6] = max(row[6], b)
    return out


def block_stats(perm, b, v, t, vc, tc):
    """``group_stats`` with sample ``perm[i]`` in group ``i // b``, summed in ``perm`` order."""
    return group_stats(
        [i // b for i in range(len(perm))],
        [v[j] for j in perm],
        [t[j] for j in perm],
        [vc[j] for j in perm],
        [tc[j] for j in perm],
        (len(perm) + b - 1) // b,
    )


def stats_pad_ratios(stats):
    """-> (vision, LLM) mean pad ratio over the groups of a ``group_stats`` table."""
    out = []
    for total, mx in ((1, 5), (2, 6)):
        ratios = [
            (row[0] * row[mx] - row[total]) / (row[0] * row[mx]) for row in stats if row[mx] > 0
        ]
        acc = 0.0
        for r in ratios:
            acc += r
        out.append(acc / max(len(ratios), 1))
    return tuple(out)


def sample_costs(vit, llm, seq_lens, a_v, b_v, c_v, a_t, b_t, c_t):
    """-> (vision costs, LLM costs); ``seq_lens[i]`` lists sample i's image sequence lengths
    (``c_v`` per image sequence, ``c_t`` per sample)."""
    vc, tc = [], []
    for v, x, lens in zip(vit, llm, seq_lens, strict=True):
        sq = 0.0
        for s in lens:
            sq += float(s) * float(s)
        vc.append(a_v * float(v) + b_v * sq + c_v * float(len(lens)))
        tc.append(a_t * float(x) + b_t * float(x) * float(x) + c_t)
    return vc, tc


def place_on_nodes(loads, nodes, per_node):
    """Per step, groups heaviest (summed over the phases) first onto the node with a free slot
    whose largest phase load after adding the group is lowest (the first such node on a tie);
    ``loads[step][group]`` lists the group's load in each phase."""
    node_out, local_out = [], []
    for step in loads:
        d = len(step)
        order = sorted(range(d), key=lambda i: -sum(step[i], 0.0))  # stable, like mergesort
        acc, used = [[0.0] * len(step[0]) for _ in range(nodes)], [0] * nodes
        node, local = [-1] * d, [-1] * d
        for g in order:
            free = [n for n in range(nodes) if used[n] < per_node]
            best = min(
                free,
                key=lambda n: (max(a + x for a, x in zip(acc[n], step[g], strict=True)), n),
            )
            node[g], local[g] = best, used[best]
            used[best] += 1
            acc[best] = [a + x for a, x in zip(acc[best], step[g], strict=True)]
        node_out.append(node)
        local_out.append(local)
    return node_out, local_out


def refine(lengths, order, bins, d, target, max_steps, cap, cap_lengths, max_count, moves):
    """-> (bins, loads); see ``_nb_refine``. Brute force over every bin and item per step."""
    n = len(lengths)
    bins = list(bins)
    loads = [0.0] * d
    mem = [0.0] * d
    count = [0] * d
    for i in range(n):
        loads[bins[i]] += lengths[i]
        mem[bins[i]] += cap_lengths[i]
        count[bins[i]] += 1
    top = max(count) if d else 0
    width = top + max(4, top // 2)
    if max_count > 0:
        width = max(top, min(width, max_count))
    rank = {i: n - 1 - k for k, i in enumerate(order)}
    asc = sorted(lengths)

    def members(b):  # ascending length, ties by the ascending rank
        return sorted((i for i in range(n) if bins[i] == b), key=lambda i: rank[i])

    def pair(a, b):
        """(x item, y item or None) closest to gap/2 in (0, gap), or None."""
        gap = loads[a] - loads[b]
        half = gap / 2
        best, best_err = None, math.inf
        for i in members(a):
            x = lengths[i]
            fits = cap <= 0 or mem[b] + cap_lengths[i] <= cap
            if moves and count[b] < width and 0 < x < gap and fits and abs(x - half) < best_err:
                best, best_err = (i, None), abs(x - half)
            below = [j for j in members(b) if lengths[j] < x - half]
            above = [j for j in members(b) if lengths[j] >= x - half]
            for j in below[-1:] + above[:1]:  # the two items of b around x - gap/2
                delta = x - lengths[j]
                if not 0 < delta < gap:
                    continue
                dm = cap_lengths[i] - cap_lengths[j]
                if cap > 0 and (mem[b] + dm > cap or mem[a] - dm > cap):
                    continue
                if abs(delta - half) < best_err:
                    best, best_err = (i, j), abs(delta - half)
        return best

    for _ in range(max_steps):
        a = min(range(d), key=lambda c: (-loads[c], c))
        if loads[a] <= target:
            break
        b = min(range(d), key=lambda c: (loads[c], c))
        op = pair(a, b)
        if op is None:  # the bin of the item y < x (x in a) with the least load_bin - y
            slack = 0.0
            for i in sorted(members(a), key=lambda i: -rank[i]):
                x = lengths[i]
                q = bisect.bisect_left(asc, x)
                cands = [j for j in range(n) if rank[j] < q]
                if not cands:
                    continue
                j = min(cands, key=lambda j: (loads[bins[j]] - lengths[j], rank[j]))
                if loads[a] - x - (loads[bins[j]] - lengths[j]) > slack:
                    slack = loads[a] - x - (loads[bins[j]] - lengths[j])
                    b = bins[j]
            if slack > 0:
                op = pair(a, b)
        if op is None and (cap > 0 or max_count > 0):
            for b in sorted(range(d), key=lambda c: (loads[c], c)):
                if loads[b] >= loads[a]:
                    break
                op = pair(a, b)
                if op is not None:
                    break
        if op is None:
            break
        i, j = op
        delta, dm = lengths[i], cap_lengths[i]
        count[a] -= 1
        count[b] += 1
        if j is not None:
            bins[j] = a
            delta -= lengths[j]
            dm -= cap_lengths[j]
            count[a] += 1
            count[b] -= 1
        bins[i] = b
        loads[a] -= delta
        loads[b] += delta
        mem[a] -= dm
        mem[b] += dm
    return bins, loads


def local_first(lengths, order, src, d, per_node, target):
    """Keep items at home while under ``target``, then the lightest rank of the node that stays
    under it, then the lightest rank anywhere (the first one on a tie)."""
    loads = [0.0] * d
    dest = [-1] * len(lengths)
    pending = []
    for i in order:
        r = src[i]
        if loads[r] == 0 or loads[r] + lengths[i] <= target:
            dest[i] = r
            loads[r] += lengths[i]
        else:
            pending.append(i)
    rest = []
    for i in pending:
        base = (src[i] // per_node) * per_node
        fits = [r for r in range(base, base + per_node) if loads[r] + lengths[i] <= target]
        if fits:
            r = min(fits, key=lambda r: (loads[r], r))
            dest[i] = r
            loads[r] += lengths[i]
        else:
            rest.append(i)
    for i in rest:
        r = min(range(d), key=lambda r: (loads[r], r))
        dest[i] = r
        loads[r] += lengths[i]
    return dest, loads


def greedy_node_assign(benefit, per_node):
    """Batches to nodes, the (batch, node) pair of highest benefit first (ties: row-major)."""
    d, nodes = len(benefit), len(benefit[0])
    pairs = sorted(
        ((j, n) for j in range(d) for n in range(nodes)), key=lambda p: -benefit[p[0]][p[1]]
    )
    node_of, used = [-1] * d, [0] * nodes
    for j, n in pairs:
        if node_of[j] < 0 and used[n] < per_node:
            node_of[j] = n
            used[n] += 1
    return node_of


def one_f_one_b_times(fwd, bwd, order):
    """-> (start_f, end_f, start_b, end_b), lists [stage][position]; see ``_nb_1f1b_times``.

    Written as a longest path over the schedule's dependency graph (Kahn's order): each stage's
    op sequence (min(p - s - 1, l) warm-up forwards, then forward/backward pairs, then the
    remaining backwards) plus data edges (forward from stage s - 1, backward from stage s + 1;
    the last stage's backward after its own forward)."""
    p, m = len(fwd), len(order)
    seq = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [("f", j) for j in range(warm)]
        for j in range(warm, m):
            ops += [("f", j), ("b", j - warm)]
        ops += [("b", j) for j in range(m - warm, m)]
        seq.append(ops)
    preds = {}
    for s, ops in enumerate(seq):
        for k, (kind, j) in enumerate(ops):
            before = [(s, *ops[k - 1])] if k else []
            if kind == "f" and s > 0:
                before.append((s - 1, "f", j))
            if kind == "b":
                before.append((s + 1, "b", j) if s < p - 1 else (s, "f", j))
            preds[(s, kind, j)] = before
    waiting = {n: len(b) for n, b in preds.items()}
    after = {n: [] for n in preds}
    for n, b in preds.items():
        for q in b:
            after[q].append(n)
    ready = [n for n, c in waiting.items() if c == 0]
    start, end = {}, {}
    while ready:
        n = ready.pop()
        s, kind, j = n
        start[n] = max((end[q] for q in preds[n]), default=0.0)
        end[n] = start[n] + (fwd if kind == "f" else bwd)[s][order[j]]
        for q in after[n]:
            waiting[q] -= 1
            if waiting[q] == 0:
                ready.append(q)
    assert len(end) == len(preds), "the 1F1B schedule has a cycle"

    def table(d, kind):
        return [[d[(s, kind, j)] for j in range(m)] for s in range(p)]

    return table(start, "f"), table(end, "f"), table(start, "b"), table(end, "b")


def swap_descent(fwd, bwd, order, max_passes, max_evals):
    """-> order list; see ``_nb_swap_descent`` (makespans from ``one_f_one_b_times``)."""

    def makespan(o):
        return max((x for row in one_f_one_b_times(fwd, bwd, o)[3] for x in row), default=0.0)

    o = list(order)
    best = makespan(o)
    evals = 0
    for _ in range(max_passes):
        improved = False
        for i in range(len(o) - 1):
            for j in range(i + 1, len(o)):
                if evals >= max_evals:
                    return o
                evals += 1
                o[i], o[j] = o[j], o[i]
                val = makespan(o)
                if val < best - 1e-12 * best:
                    best, improved = val, True
                else:
                    o[i], o[j] = o[j], o[i]
        if not improved:
            break
    return o


def refine_step(x, slot, d, q, max_moves, eps=1e-5):
    """-> (slot list, moves); see ``_nb_refine_step``: each phase's heaviest group (the
    heaviest phase first) gives a sample to, or swaps one with, the lightest partner with a
    move that lowers the weighted sum of squared group loads by more than ``eps``; until none
    does. The gain of a shift ``d_j`` is ``w_j^2 * 2 d_j (d_j - (L_hj - L_lj))`` summed over the
    phases, the change of the sum of squares written out (tests check it against the squares)."""
    k = len(q)
    slot = list(slot)
    loads = [[0.0] * k for _ in range(d)]
    for i, row in enumerate(x):
        for j in range(k):
            loads[slot[i]][j] += row[j]
    w = []
    for j in range(k):
        tot = 0.0
        for r in range(d):
            tot += loads[r][j]
        w.append(d / tot if tot > 0 else 0.0)

    moves = 0
    while moves < max_moves:
        heads = [max([0.0] + [loads[r][j] * w[j] for r in range(d)]) for j in range(k)]
        done = False
        for jw in sorted(range(k), key=lambda j: -heads[j]):
            if heads[jw] <= 0.0:
                break
            h = next(r for r in range(d) if loads[r][jw] * w[jw] == heads[jw])
            for lg in sorted(range(d), key=lambda r: loads[r][jw]):
                if lg == h:
                    continue
                best, pick = -eps, None
                for a in (i for i in range(len(x)) if slot[i] == h):
                    for b in [-1] + [i for i in range(len(x)) if slot[i] == lg]:
                        shift = [x[a][j] - (x[b][j] if b >= 0 else 0) for j in range(k)]
                        new_h = [loads[h][j] - shift[j] for j in range(k)]
                        new_l = [loads[lg][j] + shift[j] for j in range(k)]
                        if any(
                            new_l[j] > max(q[j], loads[lg][j]) or new_h[j] > max(q[j], loads[h][j])
                            for j in range(k)
                        ):
                            continue
                        gain = 0.0
                        for j in range(k):
                            gap = loads[h][j] - loads[lg][j]
                            gain += w[j] * w[j] * 2.0 * float(shift[j]) * (float(shift[j]) - gap)
                        if gain < best:
                            best, pick = gain, (a, b, new_h, new_l)
                if pick is not None:
                    a, b, loads[h], loads[lg] = pick
                    slot[a] = lg
                    if b >= 0:
                        slot[b] = h
                    moves += 1
                    done = True
                    break
            if done:
                break
        if not done:
            break
    return slot, moves


def clear_sparse(x, group_of, by_step, q, n_groups, clear_above=0.25):
    """-> (group_of list, moved); see ``balancing._kernels.sparse_steps``: phase by phase, step by
    step, a step where some group lacks the phase, none is empty and the phase's dist ratio passes
    ``clear_above`` sends each of its items of the phase to the lightest group (in the phase) of
    the next step in turn whose groups all carry the phase, where the item passes no cap and
    raises none of that step's largest loads; all of a step's items or none (then undone)."""
    k = len(q)
    group_of = list(group_of)
    steps = [list(row) for row in by_step]
    step_of = {g: s for s, row in enumerate(steps) for g in row}
    loads = [[0.0] * k for _ in range(n_groups)]
    count = [0] * n_groups
    for i, g in enumerate(group_of):
        count[g] += 1
        for p in range(k):
            loads[g][p] += x[i][p]

    def top(s, p):
        return max(loads[g][p] for g in steps[s])

    def carrying(s, p):
        return sum(loads[g][p] > 0 for g in steps[s])

    def fits(i, g):
        s = step_of[g]
        return all(
            x[i][p] == 0 or loads[g][p] + x[i][p] <= min(max(q[p], loads[g][p]), top(s, p))
            for p in range(k)
        )

    def shift(i, g, g2):
        for p in range(k):
            loads[g][p] -= x[i][p]
            loads[g2][p] += x[i][p]
        count[g] -= 1
        count[g2] += 1
        group_of[i] = g2

    d = len(steps[0]) if steps else 0
    moved, start = 0, 0
    for j in range(k):
        members = {
            s: [i for i in range(len(x)) if step_of[group_of[i]] == s] for s in range(len(steps))
        }
        for s in range(len(steps)):
            nz = carrying(s, j)
            mx = top(s, j)
            spread = 1 - sum(loads[g][j] for g in steps[s]) / (mx * d) if mx > 0 else 0.0
            if nz == 0 or nz == d or spread <= clear_above or any(count[g] == 0 for g in steps[s]):
                continue
            done = []
            for i in members[s]:
                g = group_of[i]
                if x[i][j] == 0:
                    continue
                lost = count[g] < 2 or any(
                    p != j and x[i][p] > 0 and loads[g][p] - x[i][p] <= 0 for p in range(k)
                )
                pick = None
                for t in range(len(steps)):
                    s2 = (start + t) % len(steps)
                    if lost or s2 == s or carrying(s2, j) < d:
                        continue
                    ok = [g2 for g2 in steps[s2] if fits(i, g2)]
                    if ok:
                        pick = (s2, min(ok, key=lambda g2: (loads[g2][j], steps[s2].index(g2))))
                        break
                if pick is None:
                    for i2, g0 in reversed(done):
                        shift(i2, group_of[i2], g0)
                    done = None
                    break
                shift(i, g, pick[1])
                done.append((i, g))
                start = pick[0] + 1
            if done is not None:
                moved += len(done)
    return group_of, moved
