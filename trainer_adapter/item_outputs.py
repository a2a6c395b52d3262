"""Per-item module outputs, routed home: how a wrapped module's outputs (a tensor, a
``ModelOutput``, tuples and lists of them) travel back to the ranks their items came from.

All outputs of an item go back in ONE exchange (packed item by item), so the backward of that
exchange runs on every rank as soon as any of the outputs is used. A rank that ran the module
on nothing rebuilds the structure from another rank's :func:`output_signature` with zero rows, tied
to the module's parameters (:func:`output_anchor`) so they get a zero gradient, not None.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.group_errors import raise_together, reason_of
from trainer_adapter.item_exchange import ItemRoute
from trainer_adapter.route import _ranges

__all__ = [
    "output_agree",
    "output_anchor",
    "output_route_back",
    "output_signature",
    "param_zeros",
    "route_home",
    "run_received",
    "runs_everywhere",
    "zero_of",
]


def output_signature(out, rows_in: int):
    """A picklable description of a module output: its structure, and for each tensor its
    trailing shape, dtype and rows per input row (as a reduced fraction)."""
    if out is None:
        return ("none",)
    if isinstance(out, torch.Tensor):
        g = math.gcd(out.shape[0], rows_in) or 1
        return ("tensor", tuple(out.shape[1:]), str(out.dtype), out.shape[0] // g, rows_in // g)
    if isinstance(out, dict):  # ModelOutput included
        cls = type(out)
        keys = [k for k in out.keys() if out[k] is not None]  # noqa: SIM118 (ModelOutput)
        return (
            "dict",
            cls.__module__,
            cls.__qualname__,
            [(k, output_signature(out[k], rows_in)) for k in keys],
        )
    if isinstance(out, list | tuple):
        return ("seq", type(out).__name__, [output_signature(v, rows_in) for v in out])
    raise TypeError(f"cannot route a {type(out).__name__} output back to its rank")


def _leaves(out, sig) -> list:
    """The tensors of ``out`` (None where ``out`` is None) in ``sig``'s order, with their sigs."""
    kind = sig[0]
    if kind == "none":
        return []
    if kind == "tensor":
        return [(out, sig)]
    if kind == "dict":  # a key the signing rank had may be None here (a joined rank's call)
        return [x for k, s in sig[3] for x in _leaves(None if out is None else out.get(k), s)]
    return [x for i, s in enumerate(sig[2]) for x in _leaves(None if out is None else out[i], s)]


def _rebuild(sig, tensors):
    kind = sig[0]
    if kind == "none":
        return None
    if kind == "tensor":
        return next(tensors)
    if kind == "dict":
        got = {k: _rebuild(s, tensors) for k, s in sig[3]}
        cls = importlib.import_module(sig[1])
        for part in sig[2].split("."):
            cls = getattr(cls, part)
        fields = getattr(cls, "__dataclass_fields__", None)
        if fields is None:
            return cls(**got)
        # a ModelOutput may carry keys its class does not declare (transformers' output
        # recorders set e.g. router_logits on a vision tower's output): set after building
        obj = cls(**{k: v for k, v in got.items() if k in fields})
        for k, v in got.items():
            if k not in fields:
                obj[k] = v
        return obj
    vals = [_rebuild(s, tensors) for s in sig[2]]
    return tuple(vals) if sig[1] == "tuple" else vals


def output_route_back(out, sig, route: ItemRoute, rows: np.ndarray, anchor: torch.Tensor):
    """Every tensor of ``out`` (this rank's received items, global order) back to the items'
    own ranks, in ONE exchange (all outputs of an item packed together), so its backward runs
    on every rank as soon as any output is used. ``out`` is None on a rank that received
    nothing: rebuilt from ``sig`` with zero rows, tied to ``anchor``."""
    leaves = _leaves(out, sig)
    if not leaves:
        return _rebuild(sig, iter(()))
    # one exchange in a dtype that holds every output exactly (under autocast a tower returns
    # bf16 products beside float32 norms); each output takes its own dtype back on arrival
    kinds = [getattr(torch, s[2].removeprefix("torch.")) for _, s in leaves]
    dt = functools.reduce(torch.promote_types, kinds)
    sizes = []  # per output: elements per item (all items, global order)
    for _, (_, trailing, _, num, den) in leaves:
        if np.any(rows * num % den):
            raise ValueError("a per-item output whose rows are not proportional to its input's")
        sizes.append(rows * num // den * int(np.prod(trailing, dtype=np.int64)))
    sizes = np.stack(sizes)  # [outputs, items]
    here = route.received
    if out is None:
        flat = anchor.new_zeros(0, dtype=dt) + anchor.to(dt) * 0
    else:
        parts = [t.reshape(-1).to(dt) for t, _ in leaves]
        base = np.cumsum([0] + [p.numel() for p in parts])[:-1]
        starts = [np.cumsum(sz[here]) - sz[here] + b for sz, b in zip(sizes, base, strict=True)]
        # item-major: item 1's blocks of every output, then item 2's, ...
        st = np.stack(starts, axis=1).reshape(-1)
        ln = sizes[:, here].T.reshape(-1)
        idx = _ranges(st, ln)
        flat = torch.cat(parts)[torch.from_numpy(idx).to(parts[0].device)]
    got = route.back(flat.reshape(-1, 1), sizes.sum(axis=0), "outputs").reshape(-1)
    mine = route.own
    per = sizes[:, mine]  # [outputs, my items]
    item_start = np.cumsum(per.sum(axis=0)) - per.sum(axis=0)
    tensors = []
    for k, (_, (_, trailing, _, _, _)) in enumerate(leaves):
        off = item_start + per[:k].sum(axis=0)
        idx = torch.from_numpy(_ranges(off, per[k])).to(got.device)
        width = int(np.prod(trailing, dtype=np.int64))
        rows_k = int(per[k].sum()) // width if width else 0
        # indexed in the output's shape (not a view of the exchange's buffer, which FSDP2
        # warns about when a sharded module returns it)
        tensors.append(got[idx.reshape(rows_k, *trailing)].to(kinds[k]))
    return _rebuild(sig, iter(tensors))


def run_received(
    route: ItemRoute,
    run: Callable[[], Any],
    module=None,
    phase: str = "vision",
    items=None,
    padded: bool = False,
) -> tuple[Any, BaseException | None]:
    """``run()`` (the module on the items this rank received; None where it received none) and
    its error, caught: the rank takes it into :func:`output_agree`, where every rank raises it
    (:mod:`trainer_adapter.group_errors`) instead of waiting for this one. A ``module`` with an
    ``equishard_timer`` (:func:`~trainer_adapter.hf.balance.balance_model`'s ``timer``) has
    the run timed as ``phase``, with the received items' lengths (column 0 of the table), or
    ``items`` (the sequences the module runs for them, ``padded`` where it pads them to the
    longest: an audio tower's chunks or windows, the terms its cost prices)."""
    if not route.received.size:
        return None, None
    timer = getattr(module, "equishard_timer", None)
    timed = (
        timer.phase(
            phase,
            items=route.table[route.received, 0].tolist() if items is None else items,
            padded=padded,
        )
        if timer is not None
        else contextlib.nullcontext()
    )
    try:
        with timed:
            return run(), None
    except Exception as e:  # raised on every rank by output_agree
        return None, e


def output_agree(
    sig,
    group,
    own_call: bool = True,
    failure: BaseException | None = None,
    where: str = "",
    proportional: bool = False,
):
    """The output signature of a rank that ran the module (all ranks: the same one), taken
    from a rank that called the module with its own arguments where one ran it (``own_call``
    False: a rank that only joined the exchange, whose call may ask for more outputs, e.g.
    every layer's hidden states, than the model's own calls do). ``failure``: this rank's
    error running the module (:func:`run_received`); every rank raises
    :class:`~trainer_adapter.group_errors.StepRefused` if any rank has one.
    ``proportional``: the ranks' outputs must have the same rows per input row (see
    :func:`_same_fractions`), else every rank raises a ``ValueError``."""
    sigs = [None] * dist.get_world_size(group)
    reason = None if failure is None else reason_of(failure)
    dist.all_gather_object(sigs, (own_call, sig, reason), group=group)
    raise_together([r for _, _, r in sigs], where or "the balanced module", failure)
    if proportional:
        _same_fractions(sigs, where)
    ran = [(own, s) for own, s, _ in sigs if s is not None]
    return next((s for own, s in ran if own), ran[0][1] if ran else None)


def _fractions(sig) -> tuple:
    """Rows out per row in of every tensor of an output signature, in its order."""
    kind = sig[0]
    if kind == "tensor":
        return ((sig[3], sig[4]),)
    if kind == "dict":
        return tuple(f for _, s in sig[3] for f in _fractions(s))
    if kind == "seq":
        return tuple(f for s in sig[2] for f in _fractions(s))
    return ()


def _same_fractions(sigs: list, where: str) -> None:
    """Outputs are routed home by rows per input row, one ratio for all items (a Qwen tower's
    merged tokens: a quarter of its patches). A module whose rows per item follow another rule
    (a tower that merges a video's frames into one grid: ``h*w`` rows out for ``t*h*w`` in)
    gives ranks holding different items different ratios, and routing by one ratio would hand
    rows to the wrong items: every rank raises (all see the same signatures)."""
    seen = {r: _fractions(s) for r, (own, s, _) in enumerate(sigs) if own and s is not None}
    if len(set(seen.values())) > 1:
        by_rank = "; ".join(
            f"rank {r}: {', '.join(f'{a}/{b}' for a, b in f)}" for r, f in seen.items()
        )
        raise ValueError(
            f"{where or 'the balanced module'}: its outputs are not a fixed number of rows per "
            f"input row (rows out per row in, by rank: {by_rank}), so balancing cannot tell "
            "which output rows belong to which image; balance the decoder only "
            "(balance_model(..., encoder=False)) or wrap the module with a wrapper that knows "
            "its rows per item"
        )


def _sharded(p: torch.Tensor) -> bool:
    """A parameter FSDP2 (``fully_shard``) holds sharded: a DTensor, as outside its module's
    forward; inside, the module's own parameters are plain unsharded tensors."""
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)


def runs_everywhere(module: torch.nn.Module, policy) -> bool:
    """Whether every rank runs ``module`` whenever any does (``plan_items(idle=True)``):
    ``policy.idle_ranks`` ``run``, or ``auto`` and ``module`` holds FSDP2 units (``fully_shard``
    on it or on its blocks), whose all-gathers would otherwise wait for the ranks skipping it."""
    if policy.idle_ranks != "auto":
        return policy.idle_ranks == "run"
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())


def param_zeros(module: torch.nn.Module, shape) -> torch.Tensor:
    """Plain zeros of ``shape`` in the dtype and on the device of ``module``'s parameters
    (not a DTensor where ``fully_shard`` holds them sharded: inputs for the module's call)."""
    p = next(module.parameters())
    return torch.zeros(shape, dtype=p.dtype, device=p.device)


def output_anchor(module: torch.nn.Module) -> torch.Tensor:
    """A zero that depends on every trainable parameter (their gradient becomes 0, not None,
    as DDP wants). FSDP2's sharded parameters are left out: it takes an unused one as is."""
    params = [p for p in module.parameters() if p.requires_grad and not _sharded(p)]
    if not params:
        return torch.zeros(())
    return sum(p.reshape(-1)[:1].sum() for p in params) * 0


def route_home(
    module: torch.nn.Module,
    out,
    x: torch.Tensor,
    route: ItemRoute,
    group,
    own_call: bool = True,
    failure: BaseException | None = None,
    rows: int = 0,
):
    """The outputs ``module`` made for the items this rank received (None if it received
    none), back on the items' own ranks. Every output has a fixed number of rows per row of
    the item table's column ``rows`` (0: the input rows; an audio tower's output tokens,
    which its stem and pooling make from the input frames, where the two are not
    proportional). ``x`` is what this rank received: on a rank that received nothing, its
    (empty) received tensor and the parameters are tied into the result, so every exchange's
    backward runs. ``own_call``, ``failure``: see :func:`output_agree`."""
    rows_in = int(route.table[route.received, rows].sum())
    sig = None if out is None else output_signature(out, rows_in)
    where = f"{type(module).__name__} (balanced)"
    sig = output_agree(sig, group, own_call, failure, where, proportional=True)
    anchor = output_anchor(module) + (x.sum() * 0 if out is None else 0)
    return output_route_back(out, sig, route, route.table[:, rows], anchor)


def zero_of(out) -> torch.Tensor:
    """A zero that depends on every tensor of a module output (to keep it in the graph)."""
    leaves = torch.utils._pytree.tree_leaves(dict(out) if isinstance(out, dict) else out)
    return sum(t.sum() for t in leaves if isinstance(t, torch.Tensor)) * 0
