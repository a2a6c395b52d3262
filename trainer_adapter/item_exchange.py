"""Model-agnostic balancing: move per-item payloads of any structure across the DP group.

An *item* is whatever is balanced: a sample (LLM side) or an image (encoder side). Each rank
describes its own items by a small int64 table (one row per item: the row counts of its payload
tensors and whatever the cost needs); :func:`plan_items` gathers only those tables, computes the
same plan on every rank with ``balancing``'s kernels (and the node-wise placement), and returns
an :class:`ItemRoute`. Payloads then move with :meth:`ItemRoute.send` — any tensor whose first
dimension is per-item rows (item ``i`` owning ``rows[i]`` consecutive rows): one all_to_all that
moves only what changes rank, differentiable — and results come home with
:meth:`ItemRoute.back`, in each rank's original item order. Ranks may hold no items.

:func:`trainer_adapter.redistribute` (equishard's own collated batches) and the wrappers for
Hugging Face vision towers and decoders (:mod:`trainer_adapter.hf.balance`) are built on it.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.exchange import gather_tables
from trainer_adapter.group_errors import raise_together
from trainer_adapter.redistribute import RedistributePolicy, Route, _plan_phase
from trainer_adapter.topology import Topology

__all__ = ["ItemRoute", "agreed_settings", "idle_copies", "plan_items"]


@dataclass(slots=True)
class ItemRoute:
    """The plan for one set of items. ``table`` is every rank's item table (global order:
    source rank, then position); ``src``/``dest`` the rank of each item before/after.

    Copies: where the plan was asked to keep every rank running the module (``plan_items(
    idle=True)``), each rank that would receive no item gets a copy of one (its own cheapest if
    it had any, else the cheapest of all), appended after the ``items`` real ones: ``table``,
    ``src`` and ``dest`` hold the copies too, ``copy_of`` the item each copies. A copy travels
    like an item (:meth:`send`); its results are not sent home (:meth:`back`).

    ``dtypes``: the dtype of each payload by name, agreed by the ranks that bring items
    (``plan_items(dtypes=)``); :meth:`send` gives an empty payload of a rank without items
    that dtype, so that it receives (and in the backward sends) what the others send."""

    route: Route
    table: np.ndarray
    src: np.ndarray
    dest: np.ndarray
    method: str = ""
    loads_before: np.ndarray = field(default_factory=lambda: np.zeros(0))
    loads_after: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # the loads the plan gives: ``loads_after``, but under ``policy.dry_run`` (nothing moves)
    # the loads it would have given
    loads_planned: np.ndarray = field(default_factory=lambda: np.zeros(0))
    seconds: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    copy_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    dtypes: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.route.rank

    @property
    def items(self) -> int:
        """How many real items (not copies) the plan holds."""
        return int(self.src.size - self.copy_of.size)

    @property
    def received(self) -> np.ndarray:
        """Global indices of the items this rank holds after the move, in arrival order (a
        copy last: its index is ``items`` or more)."""
        return np.flatnonzero(self.dest == self.rank)

    @property
    def own(self) -> np.ndarray:
        """Global indices of the items this rank held before the move (its local order)."""
        return np.flatnonzero(self.src[: self.items] == self.rank)

    @property
    def moved(self) -> int:
        """How many items of all ranks changed rank (copies not counted)."""
        n = self.items
        return int((self.src[:n] != self.dest[:n]).sum())

    def _origin(self) -> np.ndarray | None:
        if not self.copy_of.size:
            return None
        return np.concatenate([np.arange(self.items, dtype=np.int64), self.copy_of])

    def _rows(self, rows) -> np.ndarray:
        if isinstance(rows, int | np.integer):
            return self.table[:, int(rows)]
        rows = np.asarray(rows, dtype=np.int64)
        if self.copy_of.size and rows.shape == (self.items,):  # the copies' from their items'
            rows = np.concatenate([rows, rows[self.copy_of]])
        if rows.shape != self.src.shape:
            raise ValueError(f"rows must give one count per item ({self.items}), got {rows.shape}")
        return rows

    def send(self, x: torch.Tensor, rows, name: str = "payload") -> torch.Tensor:
        """This rank's items' row blocks (its local order) -> the blocks of the items it holds
        after the move (global order). ``rows``: a column of the item table, or a count per
        item of all ranks. Collective: every rank calls it."""
        t0 = time.perf_counter()
        rows = self._rows(rows)
        want = self.dtypes.get(name)
        if want is not None and x.dtype != want:
            # a rank without items of its own holds a placeholder, made in its own dtype (its
            # parameters', its embeddings'): it receives the senders' dtype instead
            assert not len(x), f"{name}: {x.dtype} given, {want} declared to plan_items"
            x = x.to(want)
        out = self.route.move(x, rows, self.src, self.dest, name, copy_of=self._origin())
        self.seconds["exchange"] = self.seconds.get("exchange", 0.0) + time.perf_counter() - t0
        return out

    def back(self, y: torch.Tensor, rows, name: str = "results") -> torch.Tensor:
        """The reverse of :meth:`send`: blocks of the items this rank holds (global order) ->
        those of the items it held before, in its original order. Differentiable. A copy's
        block stays here: cut off, yet in the graph through the cut (its gradient a zero), so
        the backward runs through the module that made it on every rank (FSDP2's
        reduce-scatters)."""
        t0 = time.perf_counter()
        rows, n = self._rows(rows), self.items
        if self.copy_of.size:  # copies arrive last
            here = self.received
            y = y[: int(rows[here[here < n]].sum())]
        out = self.route.move(y, rows[:n], self.dest[:n], self.src[:n], name)
        self.seconds["exchange"] = self.seconds.get("exchange", 0.0) + time.perf_counter() - t0
        return out

    def summary(self) -> dict:
        def imb(x):
            x = np.asarray(x, dtype=np.float64)
            return float(x.max() / x.mean()) if x.size and x.mean() > 0 else 1.0

        return {
            "items": self.items,
            "copies": int(self.copy_of.size),
            "moved": self.moved,
            "method": self.method,
            "max_over_mean_before": imb(self.loads_before),
            "max_over_mean_after": imb(self.loads_after),
            "max_over_mean_planned": imb(self.loads_planned),
            "bytes": {k: dict(v) for k, v in self.route.bytes.items()},
            "seconds": dict(self.seconds),
        }


def plan_items(
    local_table: np.ndarray,
    cost: Callable[[np.ndarray], np.ndarray],
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
    volume: Callable[[np.ndarray], np.ndarray] | None = None,
    refusal: BaseException | None = None,
    where: str = "plan_items",
    settings: dict | None = None,
    idle: bool = False,
    dtypes: dict[str, torch.dtype | None] | None = None,
) -> ItemRoute:
    """Gather every rank's item table (int64 ``[n_items, k]``), compute each item's cost with
    ``cost(table) -> float[N]`` and its bytes moved with ``volume`` (each rank's of its own items,
    carried in the table; default: the cost), and
    plan the destination of every item. Same result on every rank; collective. A rank that
    cannot give its table passes its error as ``refusal``: every rank raises
    :class:`~trainer_adapter.group_errors.StepRefused` (named ``where``) with it.

    ``settings``: the plain values the module is called with beside its items (Granite
    Docling's ``fine``: which path its tower takes), which every rank that runs items must run
    them with. The ranks that bring items must agree (each item carries a fingerprint of its
    rank's, so a clean step pays nothing more), else every rank raises; ``route.settings`` is
    the agreed ones, also on a rank that brought none (an extra gather then, only where there
    are settings), to call the module with on what it received.

    ``idle``: keep every rank running the module whenever any does: a rank the plan gives no
    item receives a copy of one (see :class:`ItemRoute`), whose results are dropped. For
    modules sharded by FSDP2 per block (``fully_shard``) or ZeRO-3, whose forward and backward
    are collectives every rank must join as often as the others.

    ``dtypes``: the dtype of each payload this rank will :meth:`~ItemRoute.send`, by its name
    (the same names on every rank; None where it has none). Each of this rank's items carries
    them, so a rank without items (its placeholders in its own dtype) says nothing; the ranks
    that bring items must agree, else every rank raises naming each rank's; ``route.dtypes``
    holds the agreed ones (carried in the gathered table: no collective more)."""
    t0 = time.perf_counter()
    policy = policy or RedistributePolicy()
    topology = topology or Topology()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if refusal is None:
        local_table = np.asarray(local_table, dtype=np.int64)
        if local_table.ndim != 2:
            refusal = ValueError(
                f"the item table must be 2-D [items, columns], got {local_table.shape}"
            )
        else:  # each item carries its bytes (from its own rank: a rank without items may
            # not know a row's size), its rank's dtypes and settings' fingerprint: ranks agree
            local_table = _with_volume(local_table, volume)
            codes = [_dtype_code(dt) for _, dt in sorted((dtypes or {}).items())]
            tag = [*codes, _fingerprint(settings)]
            local_table = np.hstack([local_table, np.tile(np.int64(tag), (len(local_table), 1))])
    tables = gather_tables(local_table, group, refusal=refusal, where=where)
    k = local_table.shape[1]
    table = np.concatenate(tables).reshape(-1, k)
    src = np.repeat(np.arange(world), [t.shape[0] for t in tables]).astype(np.int64)
    agreed = _agree_settings(table[:, -1], src, settings or {}, group, where)
    names = sorted(dtypes or {})
    agreed_dtypes = _agree_dtypes(names, table[:, k - 1 - len(names) : k - 1], src, world, where)
    table = table[:, : k - 1 - len(names)]
    t1 = time.perf_counter()
    if volume is not None:  # the senders' bytes (float64 bits), the same on every rank
        table, vol = table[:, :-1], np.ascontiguousarray(table[:, -1]).view(np.float64)
    c = np.asarray(cost(table), dtype=np.float64)
    vol = vol if volume is not None else c
    ranks = tuple(range(world))
    dest, method, before, planned = _plan_phase(c, src, ranks, topology, policy, vol)
    dest = np.asarray(dest, dtype=np.int64)
    route = Route(rank, world, group, topology, table, src, dest, dest, dest)
    out = ItemRoute(route=route, table=table, src=src, dest=dest, method=method)
    out.settings = agreed
    out.dtypes = agreed_dtypes
    out.loads_before = before
    out.loads_after = np.bincount(dest, weights=c, minlength=world) if dest.size else before
    out.loads_planned = planned
    if idle and dest.size:
        copy_of, to = idle_copies(c, src, dest, world)
        out.copy_of = copy_of
        out.table = np.concatenate([table, table[copy_of]])
        out.src = np.concatenate([src, src[copy_of]])
        out.dest = np.concatenate([dest, to])
    out.seconds = {"gather": t1 - t0, "plan": time.perf_counter() - t1}
    return out


def _with_volume(local_table: np.ndarray, volume) -> np.ndarray:
    """This rank's item table with each item's bytes (``volume`` of its own items, as float64
    bits) as a last column: the plan weighs every item by the bytes its own rank gives it,
    not by what a rank without items (its placeholders' row size, 0 bytes) would make of it
    (the node-wise placement by different weights on different ranks: plans that disagree)."""
    if volume is None:
        return local_table
    vol = np.asarray(volume(local_table), dtype=np.float64).reshape(len(local_table))
    return np.hstack([local_table, vol.view(np.int64)[:, None]])


def idle_copies(
    cost: np.ndarray, src: np.ndarray, dest: np.ndarray, world: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each rank the plan gives no item (ascending): the item it runs a copy of, its own
    cheapest if it brought any (nothing to send), else the cheapest of all (first on ties);
    and those ranks. The same on every rank (same inputs)."""
    idle = np.flatnonzero(np.bincount(dest, minlength=world) == 0)
    copy_of = np.empty(idle.size, dtype=np.int64)
    for j, r in enumerate(idle):
        own = np.flatnonzero(src == r)
        pool = own if own.size else np.arange(src.size)
        copy_of[j] = pool[np.argmin(cost[pool])]
    return copy_of, idle.astype(np.int64)


_DTYPES = tuple(
    getattr(torch, n)
    for n in (
        "float32 float64 float16 bfloat16 uint8 int8 int16 int32 int64 bool complex64 "
        "complex128 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz uint16 uint32 "
        "uint64"
    ).split()
    if hasattr(torch, n)
)


def _dtype_code(dtype: torch.dtype | None) -> int:
    """A dtype as a table entry: its place in :data:`_DTYPES` from 1; 0 for none given, -1
    for one not listed (compared as such, not cast to)."""
    if dtype is None:
        return 0
    return _DTYPES.index(dtype) + 1 if dtype in _DTYPES else -1


def _agree_dtypes(names: list[str], codes: np.ndarray, src, world: int, where: str) -> dict:
    """Each payload's dtype among the items that give one (see :func:`plan_items`); ranks that
    give one payload in different dtypes: every rank raises, naming each rank's."""
    out = {}
    for j, name in enumerate(names):
        col = codes[:, j]
        given = np.unique(col[col != 0])
        if given.size > 1:
            reasons: list[str | None] = [None] * world
            for r, c in zip(src, col, strict=True):
                if c:
                    reasons[int(r)] = f"{name} in {_DTYPES[c - 1] if c > 0 else 'another dtype'}"
            raise_together(
                reasons,
                f"{where}: {name} in different dtypes on different ranks, which one exchange "
                "cannot move (give every rank's inputs in one dtype):",
            )
        if given.size and given[0] > 0:
            out[name] = _DTYPES[int(given[0]) - 1]
    return out


def _fingerprint(settings: dict | None) -> int:
    """A fingerprint of a call's settings, the same in every process (0: none)."""
    if not settings:
        return 0
    return zlib.crc32(repr(sorted(settings.items())).encode()) | (1 << 32)


def _agree_settings(prints, src, mine: dict, group, where: str) -> dict:
    """The settings every rank that brought items was called with (see :func:`plan_items`);
    the same decision on every rank, from the gathered fingerprints."""
    distinct = np.unique(prints)
    world = dist.get_world_size(group)
    has_items = np.bincount(src, minlength=world) > 0
    if distinct.size == 0 or (distinct.size == 1 and distinct[0] == 0):
        return {}
    if distinct.size == 1 and has_items.all():
        return mine
    got: list = [None] * world
    dist.all_gather_object(got, mine if has_items[dist.get_rank(group)] else None, group=group)
    return agreed_settings(got, where)


def agreed_settings(per_rank: list[dict | None], where: str) -> dict:
    """The settings of the ranks that bring items (``per_rank``: every rank's, None where it
    brings none): the same on all of them, else every rank raises
    :class:`~trainer_adapter.group_errors.StepRefused` naming each rank's; ``{}`` if no rank
    brings any. Every rank calls it with the same gathered list."""
    given = {r: s for r, s in enumerate(per_rank) if s is not None}
    if len({repr(s) for s in given.values()}) > 1:
        raise_together(
            [f"called with {given[r]}" if r in given else None for r in range(len(per_rank))],
            f"{where} (called with different settings on different ranks, so moved items "
            "would run under another rank's; give every rank the same)",
        )
    return next(iter(given.values()), {})
