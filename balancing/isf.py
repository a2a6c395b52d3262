"""ISF grouping (OmniBal §4.1): Iterative Sampling and Filtering into balanced mini-batches.

Each round shuffles the samples not yet grouped, cuts them into groups that stay under the caps
``q_v`` (vision tokens) and ``q_t`` (LLM tokens), and keeps only the groups that reach ``qf_v``
or ``qf_t``; the rest go back for the next round. Unlike the public reference code, nothing is
dropped: a sample larger than a cap gets a group of its own (flag ``oversize``), and samples
still ungrouped after the last round are packed best-fit under the caps (flag ``leftover``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from balancing._kernels.isf import _nb_apply_round, _nb_best_fit, _nb_isf_round
from equishard.common.values import check_count

__all__ = [
    "FLAG_ISF",
    "FLAG_LAST_STEP",
    "FLAG_LEFTOVER",
    "FLAG_NAMES",
    "FLAG_OVERSIZE",
    "Groups",
    "ISFParams",
    "isf_group",
]

FLAG_ISF, FLAG_LEFTOVER, FLAG_OVERSIZE, FLAG_LAST_STEP = 0, 1, 2, 3
FLAG_NAMES = ("isf", "leftover", "oversize", "last-step")


@dataclass(frozen=True, kw_only=True, slots=True)
class ISFParams:
    """Caps of the sampling stage and targets of the filtering stage, in tokens."""

    q_v: int
    q_t: int
    qf_v: int
    qf_t: int
    rounds: int = 10
    window: int = 64  # open groups considered by the best-fit packing of leftovers

    def __post_init__(self) -> None:
        for name in ("q_v", "q_t", "qf_v", "qf_t"):  # int64 in the kernels: whole tokens
            check_count(name, getattr(self, name), 1)
        check_count("window (open groups)", self.window, 1, 1 << 16)
        if not (self.qf_v <= self.q_v and self.qf_t <= self.q_t):  # all >= 1 (checked above)
            raise ValueError(
                f"filter targets must satisfy 0 < qf <= q, got qf_v={self.qf_v} (q_v={self.q_v}), "
                f"qf_t={self.qf_t} (q_t={self.q_t})"
            )
        check_count("rounds", self.rounds, 1, 1000)


@dataclass(slots=True)
class Groups:
    """``group_of[i]`` is sample i's group; ``flags[g]`` says how group g was formed."""

    group_of: np.ndarray
    flags: np.ndarray
    kept_per_round: list[int] = field(default_factory=list)

    @property
    def n_groups(self) -> int:
        return int(self.flags.shape[0])


def isf_group(v: np.ndarray, t: np.ndarray, params: ISFParams, rng: np.random.Generator) -> Groups:
    """Group samples with vision loads ``v`` and LLM loads ``t`` (int64 arrays)."""
    v = np.ascontiguousarray(v, dtype=np.int64)
    t = np.ascontiguousarray(t, dtype=np.int64)
    n = v.shape[0]
    group_of = np.full(n, -1, dtype=np.int64)
    oversize = (v > params.q_v) | (t > params.q_t)
    remaining = np.flatnonzero(~oversize)
    ng = 0
    kept_per_round = []
    group_end = np.empty(n, dtype=np.int64)
    kept = np.empty(n, dtype=np.bool_)
    # The remaining samples travel as records (index, loads): shuffling them moves the loads
    # along, so each round reads them in order instead of gathering them at random.
    biggest = max(int(v.max()), int(t.max()), params.q_v, params.q_t) if n else 0
    load = np.int32 if biggest < 2**31 else np.int64
    rec = np.dtype([("i", np.int64), ("v", load), ("t", load)])
    cur, nxt = np.empty(remaining.size, dtype=rec), np.empty(remaining.size, dtype=rec)
    cur["i"], cur["v"], cur["t"] = remaining, v[remaining], t[remaining]
    m = remaining.size
    for _ in range(params.rounds):
        if m == 0:
            break
        order = cur[:m]
        rng.shuffle(order)  # the permutation ``rng.permutation(remaining)`` would draw
        g = _nb_isf_round(
            order["v"],
            order["t"],
            params.q_v,
            params.q_t,
            params.qf_v,
            params.qf_t,
            group_end,
            kept,
        )
        n_kept, m = _nb_apply_round(
            order["i"],
            order["v"],
            order["t"],
            group_end,
            kept,
            g,
            ng,
            group_of,
            nxt["i"],
            nxt["v"],
            nxt["t"],
        )
        kept_per_round.append(int(n_kept))
        ng += int(n_kept)
        cur, nxt = nxt, cur
    remaining = cur["i"][:m]
    flags = [np.full(ng, FLAG_ISF, dtype=np.int8)]
    if remaining.size:
        # Largest first (in cap-normalized size), ties by index: a deterministic best-fit order.
        size = v[remaining] / params.q_v + t[remaining] / params.q_t
        by_index = np.argsort(remaining, kind="stable")
        remaining, size = remaining[by_index], size[by_index]
        order = remaining[np.argsort(-size, kind="stable")]
        local = np.full(n, -1, dtype=np.int64)
        k = _nb_best_fit(order, v, t, params.q_v, params.q_t, params.window, local)
        group_of[remaining] = local[remaining] + ng
        flags.append(np.full(k, FLAG_LEFTOVER, dtype=np.int8))
        ng += k
    big = np.flatnonzero(oversize)
    group_of[big] = ng + np.arange(big.size)
    flags.append(np.full(big.size, FLAG_OVERSIZE, dtype=np.int8))
    assert (group_of >= 0).all()
    return Groups(group_of=group_of, flags=np.concatenate(flags), kept_per_round=kept_per_round)
