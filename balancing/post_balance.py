"""Runtime post-balancing (OrchMLLM §5.1): split the samples of all DP ranks into d new batches
whose loads are as even as possible. Pure functions over numpy arrays, deterministic: the same
lengths give the same plan on every rank.

Methods (``method=``):

* ``lpt`` — greedy largest-first onto the lightest batch (Alg. 1; within 4/3 of optimal);
* ``kk`` / ``kk_equal`` — Karmarkar-Karp largest differencing, optionally with equal counts
  (excellent on near-uniform lengths, poor on heavy tails);
* ``padded`` — padded batching, cost = count x longest, by binary search (Alg. 2);
* ``quadratic`` — LPT with a tolerance tie-break on sum of squares (Alg. 4);
* ``padded_attention`` — padded attention blocks, then LPT (Alg. 5);
* ``auto`` — ``lpt``; on steps of at most ``AUTO_SECOND_OPINION`` items that it leaves above
  the tolerance and more than ``AUTO_ENOUGH`` above a bound no plan can beat (:func:`lower_bound`),
  also ``kk_equal`` refined with moves, the locality start (each item kept on its own batch
  while that stays within the tolerance of the mean, in the order given: the ranks' items one
  after another, ``n / d`` each; the rest onto the lightest) refined with moves, and where
  items x batches is at most ``AUTO_KK_WORK`` the unequal ``kk`` (refined), keeping the most
  even;
* ``best`` — ``lpt`` and ``kk_equal``, keeping the better.

``lpt``, ``kk*``, ``auto`` and ``best`` are then refined: the heaviest batch moves one item to,
or swaps one with, the lightest batch that can take it (``kk_equal``: swaps only, so counts stay
equal), until the heaviest is within ``tolerance`` of the mean or no step lowers it.
``max_count`` limits samples per
batch; ``memory_cap`` limits the sum of ``memory`` (default: the lengths) per batch, with a
:class:`MemoryCapError` when no placement under it is found. Every method honours the caps: a
method that cannot build under one (``kk*``, ``padded*``, ``quadratic``) runs as usual and, when
its plan breaks the memory cap or the count cap, the LPT plan under both is used instead (its
``method`` says so); ``kk*`` refuse ``max_count`` outright.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from balancing import first_call, twins
from balancing._kernels.auto import HOME, KEPT, KK, KK_EQUAL, _nb_lower_bound, _nb_second_opinion
from balancing._kernels.partition import (
    _nb_argsort_desc,
    _nb_karmarkar_karp,
    _nb_lpt,
    _nb_lpt_capped,
    _nb_lpt_quadratic,
    _nb_padded_attention,
    _nb_padded_batches,
)
from balancing._kernels.refine import _nb_refine
from balancing.checks import finite_nonnegative, rank_count, ranks_in
from equishard.common.errors import EquishardError
from equishard.common.values import check_count

__all__ = [
    "LOCALITY",
    "METHODS",
    "METHOD_FUNCTIONS",
    "RUNTIME_METHODS",
    "MemoryCapError",
    "PostBalance",
    "batch_loads",
    "post_balance",
]

# auto also tries equal-count KK on at most this many items when refined LPT stops above the
# tolerance: on small steps either can win by a few per cent; on large ones LPT wins on average
AUTO_SECOND_OPINION = 1024
# ... and unequal KK where items x batches is at most this: its merges are d wide per item, so
# it costs about as much as the rest of auto up to here (0.6 ms at 64 ranks x 4), and on such
# steps it is the most even method about as often as LPT is (the issue-41 grid at B = 4)
AUTO_KK_WORK = 65_536
# ... and neither where LPT's heaviest batch is within this of the lower bound: no method can
# then be more even by more than this (0.1 %); at 16 samples a rank LPT ends 1e-5 above it
AUTO_ENOUGH = 1e-3
# the method a second opinion's plan reports (balancing._kernels.auto's codes)
OPINIONS = {KK_EQUAL: "kk_equal + moves", HOME: "home + moves", KK: "kk"}


class MemoryCapError(EquishardError, ValueError):
    """No placement keeps every batch under the per-rank memory cap."""


@dataclass(frozen=True, slots=True)
class PostBalance:
    """``dest[i]`` is the new batch of item i; ``loads`` the objective per batch."""

    dest: np.ndarray
    loads: np.ndarray
    method: str

    @property
    def imbalance(self) -> float:
        """max / mean of the batch loads (1.0 = perfect)."""
        mean = self.loads.mean() if self.loads.size else 0.0
        return float(self.loads.max() / mean) if mean > 0 else 1.0


def batch_loads(
    lengths: np.ndarray, dest: np.ndarray, d: int, *, padded: bool = False
) -> np.ndarray:
    """Per-batch load: sum of lengths, or count x longest when ``padded`` (its inputs checked:
    a caller's numbers)."""
    d = rank_count(d, "d (batches)")
    lengths = finite_nonnegative(lengths)
    return _batch_loads(lengths, ranks_in(dest, d, "dest", lengths.size), d, padded)


def _batch_loads(lengths: np.ndarray, dest: np.ndarray, d: int, padded: bool = False) -> np.ndarray:
    """:func:`batch_loads` of lengths and destinations post_balance has already checked or made
    (its per-step path: no second pass over them)."""
    if not padded:
        return np.bincount(dest, weights=lengths, minlength=d)
    mx = np.zeros(d)
    np.maximum.at(mx, dest, lengths)
    return mx * np.bincount(dest, minlength=d)


def _over_cap(dest: np.ndarray, d: int, cap: float, mem: np.ndarray) -> bool:
    return cap > 0 and bool(np.bincount(dest, weights=mem, minlength=d).max() > cap)


def _over_count(dest: np.ndarray, d: int, max_count: int | None) -> bool:
    return max_count is not None and bool(np.bincount(dest, minlength=d).max() > max_count)


def _within_cap(
    result: PostBalance,
    x: np.ndarray,
    d: int,
    cap: float,
    mem: np.ndarray,
    order: np.ndarray,
    max_count: int | None = None,
) -> PostBalance:
    """``result``, or when it breaks the memory cap or the count cap (a method that cannot
    honour them), the LPT plan under both caps, named so the caller sees which ran."""
    memory, count = _over_cap(result.dest, d, cap, mem), _over_count(result.dest, d, max_count)
    if not (memory or count):
        return result
    dest = np.zeros(x.size, dtype=np.int64)
    bad = _nb_lpt_capped(x, order, d, max_count or 0, cap, mem, dest)
    if bad >= 0:
        i = int(order[bad])
        raise MemoryCapError(
            f"item {i} ({mem[i]:g}) fits under no rank's memory cap {cap:g}; raise the cap or the "
            "number of ranks"
        )
    broke = " and ".join(w for w, b in (("memory cap", memory), ("count cap", count)) if b)
    return PostBalance(dest, _batch_loads(x, dest, d), f"lpt ({result.method} broke the {broke})")


@dataclass(slots=True)  # not frozen: built on every runtime step, its init kept cheap
class _Step:
    """One call's checked inputs, as every method takes them."""

    x: np.ndarray  # the lengths
    d: int
    order: np.ndarray  # items by length, largest first
    tolerance: float
    max_count: int | None
    cap: float  # the memory cap (0: none)
    mem: np.ndarray  # each item's memory (the lengths unless given)
    memory: np.ndarray | None  # as the caller gave it
    memory_cap: float | None
    quadratic_tolerance: float | None
    max_swaps: int | None
    py: bool  # the kernels' plain-Python twins (while the kernels compile)

    def again(self, method: str, **changes) -> PostBalance:
        """This step balanced by another method (through :func:`post_balance`: checked)."""
        kw = dict(
            tolerance=self.tolerance,
            max_count=self.max_count,
            memory_cap=self.memory_cap,
            memory=self.memory,
            max_swaps=self.max_swaps,
        )
        return post_balance(self.x, self.d, method=method, **{**kw, **changes})


def _refined(s: _Step, dest: np.ndarray, chosen: str) -> PostBalance:
    """The heaviest batch moves one item to, or swaps one with, the lightest that can take it
    (``kk_equal``: swaps only), until it is within the tolerance or no step lowers it."""
    if chosen in ("kk", "kk_equal") and s.cap > 0 and _over_cap(dest, s.d, s.cap, s.mem):
        return _within_cap(
            PostBalance(dest, np.zeros(s.d), chosen), s.x, s.d, s.cap, s.mem, s.order
        )
    target = s.x.sum() / s.d * (1.0 + s.tolerance)
    loads = np.bincount(dest, weights=s.x, minlength=s.d)
    if loads.max() > target:
        steps = s.max_swaps if s.max_swaps is not None else 4 * s.d
        moves = chosen != "kk_equal"  # equal counts stay equal: swaps only
        refine = twins.refine if s.py else _nb_refine
        loads = refine(
            s.x, s.order, dest, s.d, target, steps, s.cap, s.mem, s.max_count or 0, moves
        )
    return PostBalance(dest=dest, loads=loads, method=chosen)


def _lpt(s: _Step) -> PostBalance:
    dest = np.zeros(s.x.size, dtype=np.int64)
    if s.max_count is None and s.cap == 0:
        if s.py:
            dest[:] = twins.lpt(s.x, s.order, s.d)
        else:
            _nb_lpt(s.x, s.order, s.d, dest)
    else:
        bad = _nb_lpt_capped(s.x, s.order, s.d, s.max_count or 0, s.cap, s.mem, dest)
        if bad >= 0:
            i = int(s.order[bad])
            raise MemoryCapError(
                f"item {i} ({s.mem[i]:g}) fits under no rank's memory cap {s.cap:g} after placing "
                f"the {bad} larger items; raise the cap or the number of ranks"
            )
    return _refined(s, dest, "lpt")


def _karmarkar_karp(s: _Step, equal: bool) -> PostBalance:
    chosen = "kk_equal" if equal else "kk"
    if s.max_count is not None:
        raise ValueError(f"{chosen} does not support max_count; use lpt")
    dest = np.zeros(s.x.size, dtype=np.int64)
    n, d = s.x.size, s.d
    if s.py and (equal or n * d <= 100_000):  # the twin's unequal KK is O(n d)
        dest[:] = twins.karmarkar_karp(s.x, s.order, d, equal)
    else:
        _nb_karmarkar_karp(s.x, s.order, d, equal, dest)
    return _refined(s, dest, chosen)


def _padded(s: _Step) -> PostBalance:
    dest = np.zeros(s.x.size, dtype=np.int64)
    asc = s.order[::-1].copy()
    runs = np.empty(s.x.size, dtype=np.int64)
    _nb_padded_batches(s.x[asc], s.d, runs)
    dest[asc] = runs
    result = PostBalance(
        dest=dest, loads=_batch_loads(s.x, dest, s.d, padded=True), method="padded"
    )
    return _within_cap(result, s.x, s.d, s.cap, s.mem, s.order, s.max_count)


def _quadratic(s: _Step) -> PostBalance:
    dest = np.zeros(s.x.size, dtype=np.int64)
    tol = s.quadratic_tolerance
    tol = tol if tol is not None else 0.01 * s.x.sum() / s.d
    _nb_lpt_quadratic(s.x, s.order, s.d, tol, dest)
    result = PostBalance(dest=dest, loads=_batch_loads(s.x, dest, s.d), method="quadratic")
    return _within_cap(result, s.x, s.d, s.cap, s.mem, s.order, s.max_count)


def _padded_attention(s: _Step) -> PostBalance:
    dest = np.zeros(s.x.size, dtype=np.int64)
    probe = np.empty(s.x.size, dtype=np.int64)
    bound = _nb_lpt(s.x, s.order, s.d, probe).max()
    _nb_padded_attention(s.x, s.order, s.d, bound, dest)
    result = PostBalance(dest=dest, loads=_batch_loads(s.x, dest, s.d), method="padded_attention")
    return _within_cap(result, s.x, s.d, s.cap, s.mem, s.order, s.max_count)


def _best(s: _Step) -> PostBalance:
    """``lpt`` and ``kk_equal`` (where no cap rules it out), the better of the two."""
    both = s.max_count is None and s.memory_cap is None
    candidates = [s.again(m) for m in ("lpt", "kk_equal") if m == "lpt" or both]
    return min(candidates, key=lambda r: r.loads.max())


def lower_bound(x: np.ndarray, order: np.ndarray, d: int) -> float:
    """A load no plan's heaviest of ``d`` batches is below: the mean, the largest item, and for
    each k the k + 1 lightest of the k * d + 1 heaviest items (k + 1 of them share a batch).
    ``order``: the items heaviest first. The kernel, or its exact twin while it compiles."""
    if first_call.kernels_ready():
        return float(_nb_lower_bound(x, order, d))
    return twins.lower_bound(x, order, d)


def _auto(s: _Step) -> PostBalance:
    """``lpt``; on small steps it leaves above the tolerance and above the lower bound by more
    than ``AUTO_ENOUGH``, also ``kk_equal``, the items' own batches and (where small enough)
    ``kk``, each refined with moves, the most even kept (``balancing._kernels.auto``)."""
    x, d, n = s.x, s.d, s.x.size
    first = _lpt(s)
    if n > AUTO_SECOND_OPINION or s.max_count is not None or s.cap > 0:
        return first
    top = first.loads.max()
    target = x.sum() / d * (1.0 + s.tolerance)
    if top <= target:
        return first
    if top <= x[s.order[0]] * (1.0 + AUTO_ENOUGH):  # the largest item alone: no need for more
        return first
    if top <= lower_bound(x, s.order, d) * (1.0 + AUTO_ENOUGH):
        return first
    steps = s.max_swaps if s.max_swaps is not None else 4 * d
    second = twins.second_opinion if s.py else _nb_second_opinion
    dest = np.zeros(n, dtype=np.int64)
    code, loads, _ = second(x, s.order, d, target, steps, n * d <= AUTO_KK_WORK, top, dest)
    if code == KEPT:
        return first
    return PostBalance(dest=dest, loads=loads, method=OPINIONS[code])


# each method by name: what post_balance(method=NAME) runs (the module docstring says how)
METHOD_FUNCTIONS = {
    "auto": _auto,
    "best": _best,
    "lpt": _lpt,
    "kk": lambda s: _karmarkar_karp(s, equal=False),
    "kk_equal": lambda s: _karmarkar_karp(s, equal=True),
    "padded": _padded,
    "quadratic": _quadratic,
    "padded_attention": _padded_attention,
}
METHODS = tuple(METHOD_FUNCTIONS)  # their names
# the runtime's methods: these, and ``locality`` (each item stays on its rank where that is
# within the tolerance, else ``lpt``: balancing.nodewise and trainer_adapter.redistribute)
LOCALITY = "locality"
RUNTIME_METHODS = (*METHODS, LOCALITY)


@first_call.entry_point
def post_balance(
    lengths: np.ndarray,
    d: int,
    *,
    method: str = "auto",
    tolerance: float = 2e-5,
    max_count: int | None = None,
    memory_cap: float | None = None,
    memory: np.ndarray | None = None,
    quadratic_tolerance: float | None = None,
    max_swaps: int | None = None,
) -> PostBalance:
    """Assign every item to one of ``d`` batches; see the module docstring for the methods."""
    run = METHOD_FUNCTIONS.get(method) if isinstance(method, str) else None
    if run is None:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    d = rank_count(d, "d (batches)")
    max_count = check_count("max_count", max_count, 0, none=True)
    max_swaps = check_count("max_swaps", max_swaps, 0, none=True)
    x = finite_nonnegative(lengths)
    n = x.size
    mem = x if memory is None else finite_nonnegative(memory, "memory")
    if mem.shape != x.shape:
        raise ValueError(f"memory has {mem.size} items, lengths {n}; give one per item")
    cap = float(memory_cap or 0.0)
    if not (np.isfinite(cap) and cap >= 0):
        raise ValueError(f"memory_cap must be finite and >= 0, got {memory_cap!r}")
    if not (np.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be finite and >= 0, got {tolerance!r}")
    if cap > 0:
        if mem.size and mem.max() > cap:
            i = int(mem.argmax())
            raise MemoryCapError(
                f"item {i} needs {mem[i]:g} alone, more than the memory cap {cap:g} per rank"
            )
        if mem.sum() > cap * d:
            raise MemoryCapError(
                f"{mem.sum():g} in total cannot fit {d} ranks x {cap:g} memory cap"
            )
    if max_count is not None and max_count * d < n:
        raise ValueError(f"{n} items cannot fit {d} batches of at most {max_count}")
    py = not first_call.kernels_ready()  # exact twins while the kernels compile
    order = twins.argsort_desc(x) if py else _nb_argsort_desc(x)
    if n == 0:
        return PostBalance(dest=np.zeros(0, dtype=np.int64), loads=np.zeros(d), method=method)
    step = _Step(
        x=x,
        d=d,
        order=order,
        tolerance=tolerance,
        max_count=max_count,
        cap=cap,
        mem=mem,
        memory=memory,
        memory_cap=memory_cap,
        quadratic_tolerance=quadratic_tolerance,
        max_swaps=max_swaps,
        py=py,
    )
    return run(step)
