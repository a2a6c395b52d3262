"""ISF grouping (OmniBal §4.1): Iterative Sampling and Filtering into balanced mini-batches.

Each round shuffles the samples not yet grouped, cuts them into groups that stay under the caps
``q_v`` (vision tokens), ``q_e`` (the tokens of each other encoder phase, e.g. audio; none for
an image + text table) and ``q_t`` (LLM tokens), and keeps only the groups that reach any
phase's target ``qf_v``, ``qf_e`` or ``qf_t``; the rest go back for the next round. Unlike
the public reference code, nothing is dropped: a sample larger than a cap gets a group of its
own (flag ``oversize``), and samples still ungrouped after the last round are packed best-fit
under the caps (flag ``leftover``).
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
MAX_EXTRA_PHASES = 8  # encoder phases beside the vision tower


@dataclass(frozen=True, kw_only=True, slots=True)
class ISFParams:
    """Caps of the sampling stage and targets of the filtering stage, in tokens: the vision
    tower's (``q_v``, ``qf_v``), each other encoder phase's in order (``q_e``, ``qf_e``: one
    each, e.g. the audio encoder's), the LLM's (``q_t``, ``qf_t``)."""

    q_v: int
    q_t: int
    qf_v: int
    qf_t: int
    rounds: int = 10
    window: int = 64  # open groups considered by the best-fit packing of leftovers
    q_e: tuple[int, ...] = ()
    qf_e: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("q_v", "q_t", "qf_v", "qf_t"):  # int64 in the kernels: whole tokens
            check_count(name, getattr(self, name), 1)
        if not isinstance(self.q_e, tuple) or not isinstance(self.qf_e, tuple):
            raise ValueError("q_e and qf_e must be tuples: one cap and one target per phase")
        if len(self.q_e) != len(self.qf_e) or len(self.q_e) > MAX_EXTRA_PHASES:
            raise ValueError(
                f"q_e {self.q_e} and qf_e {self.qf_e} must give one cap and one target for each "
                f"other encoder phase (at most {MAX_EXTRA_PHASES})"
            )
        for j, (q, qf) in enumerate(zip(self.q_e, self.qf_e, strict=True)):
            check_count(f"q_e[{j}]", q, 1)
            check_count(f"qf_e[{j}]", qf, 1)
        check_count("window (open groups)", self.window, 1, 1 << 16)
        if (self.caps < self.filters).any():  # all >= 1 (checked above)
            raise ValueError(
                f"filter targets must satisfy 0 < qf <= q, got qf_v={self.qf_v} (q_v={self.q_v}), "
                f"qf_e={self.qf_e} (q_e={self.q_e}), qf_t={self.qf_t} (q_t={self.q_t})"
            )
        check_count("rounds", self.rounds, 1, 1000)

    @property
    def caps(self) -> np.ndarray:
        """Every phase's cap, in the order of the loads' columns: vision, the others, LLM."""
        return np.array([self.q_v, *self.q_e, self.q_t], dtype=np.int64)

    @property
    def filters(self) -> np.ndarray:
        """Every phase's keep target, in the order of :attr:`caps`."""
        return np.array([self.qf_v, *self.qf_e, self.qf_t], dtype=np.int64)


@dataclass(slots=True)
class Groups:
    """``group_of[i]`` is sample i's group; ``flags[g]`` says how group g was formed."""

    group_of: np.ndarray
    flags: np.ndarray
    kept_per_round: list[int] = field(default_factory=list)

    @property
    def n_groups(self) -> int:
        return int(self.flags.shape[0])


FILL_ROWS = 1 << 20  # records filled at a time (a column's gather is 8 bytes a sample)


def isf_group(
    v: np.ndarray,
    t: np.ndarray,
    params: ISFParams,
    rng: np.random.Generator,
    *,
    extra: np.ndarray | None = None,
) -> Groups:
    """Group samples with vision loads ``v`` and LLM loads ``t`` (int64 arrays) and, for each
    other encoder phase of ``params.q_e``, a column of ``extra`` (shape (n, phases))."""
    columns = [np.asarray(v, dtype=np.int64)]
    if extra is not None:
        extra = np.asarray(extra, dtype=np.int64)
        columns += [extra[:, j] for j in range(extra.shape[1])]
    columns.append(np.asarray(t, dtype=np.int64))
    k = len(columns)
    if k != len(params.q_e) + 2:
        raise ValueError(f"{k - 2} other encoder phase(s) of loads for {len(params.q_e)} caps")
    n = columns[0].shape[0]
    q, qf = params.caps, params.filters
    group_of = np.full(n, -1, dtype=np.int64)
    oversize = np.zeros(n, dtype=np.bool_)
    for c, cap in zip(columns, q.tolist(), strict=True):
        oversize |= c > cap
    remaining = np.flatnonzero(~oversize)
    ng = 0
    kept_per_round = []
    group_end = np.empty(n, dtype=np.int64)
    kept = np.empty(n, dtype=np.bool_)
    # The remaining samples travel as records (index, loads): shuffling them moves the loads
    # along, so each round reads them in order instead of gathering them at random.
    biggest = max(max(int(c.max()) for c in columns), int(q.max())) if n else 0
    load = np.int32 if biggest < 2**31 else np.int64  # half the memory traffic at 10M rows
    rec = np.dtype([("i", np.int64), ("l", load, (k,))])
    # one array of records: a round moves the samples it leaves to the front of the same array
    # (a sample is written at or before the place it was read from, after that place was read)
    cur = np.empty(remaining.size, dtype=rec)
    cur["i"] = remaining
    for start in range(0, remaining.size, FILL_ROWS):  # no whole-column gather at once
        part = remaining[start : start + FILL_ROWS]
        for j, c in enumerate(columns):
            cur["l"][start : start + part.size, j] = c[part]
    m = remaining.size
    del remaining  # the records hold it (8 bytes a sample through every round otherwise)
    for _ in range(params.rounds):
        if m == 0:
            break
        order = cur[:m]
        rng.shuffle(order)  # the permutation ``rng.permutation(remaining)`` would draw
        g = _nb_isf_round(order["l"], q, qf, group_end, kept)
        n_kept, m = _nb_apply_round(
            order["i"], order["l"], group_end, kept, g, ng, group_of, order["i"], order["l"]
        )
        kept_per_round.append(int(n_kept))
        ng += int(n_kept)
    remaining = cur["i"][:m]
    flags = [np.full(ng, FLAG_ISF, dtype=np.int8)]
    if remaining.size:
        # Largest first (in cap-normalized size), ties by index: a deterministic best-fit order.
        remaining = np.sort(remaining)
        loads = np.empty((remaining.size, k), dtype=np.int64)
        for j, c in enumerate(columns):
            loads[:, j] = c[remaining]
        order = np.argsort(-(loads / q).sum(axis=1), kind="stable")
        local = np.full(remaining.size, -1, dtype=np.int64)
        made = _nb_best_fit(order, loads, q, params.window, local)
        group_of[remaining] = local + ng
        flags.append(np.full(made, FLAG_LEFTOVER, dtype=np.int8))
        ng += made
    big = np.flatnonzero(oversize)
    group_of[big] = ng + np.arange(big.size)
    flags.append(np.full(big.size, FLAG_OVERSIZE, dtype=np.int8))
    assert (group_of >= 0).all()
    return Groups(group_of=group_of, flags=np.concatenate(flags), kept_per_round=kept_per_round)
