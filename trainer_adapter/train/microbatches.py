"""Microbatch plans for the pipeline: pack one replica's samples into fixed-shape rows.

``torch.distributed.pipelining`` runs a schedule over microbatches of one fixed shape, so a
replica's samples are packed into ``n_microbatches`` rows of a size taken from a short ladder
(:func:`bucket_ladder`; each size gets its own schedule, built once and reused): the smallest that
holds the step (:func:`plan_step`), so padding is what the step's load leaves, not the largest
sample the data holds.

Whole samples are packed by LPT under the row size as a token cap. Where that cannot fill the
rows evenly (a few long samples per replica, or a sample longer than a row), ``split=True``
cuts samples across rows: the samples that do not fit whole are streamed into the free space
of the rows in order, a cut piece going on at the start of the next row with free space. A
sample's pieces are causal-attention chunks of one sequence: a later piece attends to the keys
and values of the earlier ones (:mod:`trainer_adapter.train.split_samples`), so a model sees exactly
the unsplit sample. Rows joined by a cut sample form a *chain* that the schedule keeps
together: forwards in row order, backwards in reverse row order.

Rows (chains, as units) are ordered for 1F1B by MMScale's inter-microbatch reordering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from balancing import MemoryCapError, inter_microbatch_reorder, post_balance

__all__ = [
    "MicrobatchPlan",
    "bucket_ladder",
    "doc_rows",
    "pack_rows",
    "plan_microbatches",
    "plan_step",
]


@dataclass(frozen=True, slots=True)
class MicrobatchPlan:
    """``spans[k]``: the ``(sample, start, stop)`` token ranges packed into microbatch k, in
    the order the schedule runs the microbatches (a sample cut across rows has one span in each,
    in consecutive rows of a chain; a continuation is the first span of its row).
    ``rows[k]``: the samples of ``spans[k]``. ``chains``: lengths of the runs of consecutive
    rows joined by cut samples (all 1 when no sample is cut)."""

    spans: tuple[tuple[tuple[int, int, int], ...], ...]
    chains: tuple[int, ...]
    tokens: int
    padding: float

    @property
    def rows(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(s for s, _, _ in row) for row in self.spans)

    @property
    def n_cut(self) -> int:
        """Samples cut across rows."""
        return len({s for row in self.spans for s, a, _ in row if a > 0})


def _whole_rows(lengths: np.ndarray, n_rows: int, cap: int) -> list[list[int]] | None:
    """Every sample whole, LPT under ``cap`` tokens per row; None where it cannot pack."""
    try:
        pb = post_balance(lengths, n_rows, method="lpt", memory_cap=float(cap))
    except MemoryCapError:
        return None
    return [np.flatnonzero(pb.dest == k).tolist() for k in range(n_rows)]


def _cut_rows(lengths: np.ndarray, n_rows: int, cap: int) -> list[list[tuple[int, int, int]]]:
    """Longest first, each sample whole into the row with the most room where it fits; the rest
    streamed in that order into the rows' free space, cut at row ends."""
    free = [cap] * n_rows
    whole: list[list[int]] = [[] for _ in range(n_rows)]
    rest = []
    for i in np.argsort(-lengths, kind="stable").tolist():
        r = int(np.argmax(free))
        if lengths[i] <= free[r]:
            whole[r].append(i)
            free[r] -= int(lengths[i])
        else:
            rest.append(i)
    stream: list[list[tuple[int, int, int]]] = [[] for _ in range(n_rows)]
    r = 0
    for i in rest:
        start, left = 0, int(lengths[i])
        while left:
            while free[r] == 0:
                r += 1  # the rows hold the step (cap * n_rows >= total), so r stays in range
            take = min(left, free[r])
            stream[r].append((i, start, start + take))
            free[r] -= take
            start, left = start + take, left - take
    out = []
    for k in range(n_rows):
        head = stream[k][:1] if stream[k] and stream[k][0][1] > 0 else []
        out.append(head + [(i, 0, int(lengths[i])) for i in whole[k]] + stream[k][len(head) :])
    return out


def _chains(spans: list[list[tuple[int, int, int]]]) -> list[list[int]]:
    """Rows joined by a cut sample, as runs in row order (a cut sample's rows are consecutive
    among the rows that had free space, so each run is ordered by row)."""
    n = len(spans)
    parent = list(range(n))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    last_row: dict[int, int] = {}
    for k, row in enumerate(spans):
        for s, a, _ in row:
            if a > 0 and s in last_row:
                parent[find(k)] = find(last_row[s])
            last_row[s] = k
    groups: dict[int, list[int]] = {}
    for k in range(n):
        groups.setdefault(find(k), []).append(k)
    return sorted(groups.values(), key=lambda g: g[0])


def plan_microbatches(
    lengths: np.ndarray,
    n_microbatches: int,
    mb_tokens: int,
    pp: int,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    gamma: float = 0.0,
    split: bool = False,
) -> MicrobatchPlan:
    """Pack samples into ``n_microbatches`` rows of at most ``mb_tokens``: whole where LPT can,
    else (``split``) cutting samples across rows; then order rows (chains) for 1F1B."""
    lengths = np.asarray(lengths, dtype=np.float64)
    total = int(lengths.sum())
    rows = _whole_rows(lengths, n_microbatches, mb_tokens)
    if rows is not None:
        spans = [[(i, 0, int(lengths[i])) for i in row] for row in rows]
    elif split and total <= n_microbatches * mb_tokens:
        spans = _cut_rows(lengths, n_microbatches, mb_tokens)
    else:
        raise ValueError(
            f"{total} tokens (longest sample {int(lengths.max(initial=0))}) do not fit "
            f"{n_microbatches} microbatches of {mb_tokens} tokens"
            + ("" if split else " with every sample whole")
            + "; raise mb_tokens or the number of microbatches"
            + ("" if split else ", or let samples be cut across microbatches")
        )
    units = _chains(spans)

    def cost(k):
        n = np.array([b - a for _, a, b in spans[k]], dtype=np.float64)
        return alpha * n.sum() + beta * (n**2).sum() + gamma * len(n)

    unit_cost = np.array([sum(cost(k) for k in u) for u in units])
    order = inter_microbatch_reorder(unit_cost, pp) if pp > 1 else np.arange(len(units))
    ordered = [units[u] for u in order]
    return MicrobatchPlan(
        spans=tuple(tuple(spans[k]) for u in ordered for k in u),
        chains=tuple(len(u) for u in ordered),
        tokens=total,
        padding=1.0 - total / (n_microbatches * mb_tokens) if mb_tokens else 0.0,
    )


def bucket_ladder(largest: int, ratio: float, smallest: int = 64, multiple: int = 16) -> list[int]:
    """Microbatch row sizes from ``smallest`` up to ``largest``, each about ``ratio`` times the
    one before (rounded up to ``multiple``); ``ratio`` 1 gives ``[largest]``."""
    if ratio <= 1.0 or largest <= smallest:
        return [largest]
    sizes, size = [], float(smallest)
    while size < largest:
        r = int(-(-int(size) // multiple) * multiple)
        if not sizes or r > sizes[-1]:
            sizes.append(r)
        size *= ratio
    return [x for x in sizes if x < largest] + [largest]


def plan_step(
    lengths: np.ndarray, n_microbatches: int, buckets: list[int], pp: int, **options
) -> tuple[int, MicrobatchPlan]:
    """The smallest row size of ``buckets`` that holds this step's samples, and its plan
    (:func:`plan_microbatches`; ``split=True`` lets samples be cut across rows, so the size
    follows the step's mean load instead of its longest sample)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    mean = lengths.sum() / n_microbatches
    need = mean if options.get("split") else max(lengths.max(initial=0.0), mean)
    last_error = None
    for mb in buckets:
        if mb < need:
            continue
        try:
            return mb, plan_microbatches(lengths, n_microbatches, mb, pp, **options)
        except ValueError as exc:  # could not pack under this size: the next one
            last_error = exc
    raise ValueError(
        f"no microbatch size up to {buckets[-1]} tokens holds this step's samples "
        f"({int(lengths.sum())} tokens, longest {int(lengths.max(initial=0))}): {last_error}"
    )


def _row_index(plan: MicrobatchPlan, cu_seqlens: np.ndarray, mb_tokens: int, pad: int):
    idx = np.full((len(plan.spans), mb_tokens), pad, dtype=np.int64)
    for k, row in enumerate(plan.spans):
        parts = [np.arange(cu_seqlens[s] + a, cu_seqlens[s] + b) for s, a, b in row]
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        idx[k, : flat.size] = flat
    return idx


def pack_rows(
    x: torch.Tensor, cu_seqlens: np.ndarray, plan: MicrobatchPlan, mb_tokens: int, fill
) -> torch.Tensor:
    """[total, ...] packed samples -> [n_microbatches, mb_tokens, ...] rows per ``plan``
    (differentiable gather; padding takes ``fill``)."""
    pad = x.new_full((1, *x.shape[1:]), fill)
    src = torch.cat([x, pad])
    idx = _row_index(plan, cu_seqlens, mb_tokens, x.shape[0])
    return src[torch.from_numpy(idx).to(x.device)]


def doc_rows(plan: MicrobatchPlan, lengths: np.ndarray, mb_tokens: int) -> torch.Tensor:
    """[n_microbatches, mb_tokens] ``2 * sample + goes_on`` for each token (``goes_on``: the
    sample's piece in this row is cut and continues in the next row of its chain; at most one
    piece per row), -1 for padding. Stages find segments and cut pieces from it (:mod:`split_samples`)."""
    out = np.full((len(plan.spans), mb_tokens), -1, dtype=np.int64)
    for k, row in enumerate(plan.spans):
        pos = 0
        for s, a, b in row:
            out[k, pos : pos + b - a] = 2 * s + (b < int(lengths[s]))
            pos += b - a
    return torch.from_numpy(out)
