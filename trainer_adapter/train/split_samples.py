"""Samples cut across pipeline microbatches: the attention carry and the schedule that keeps it.

A sample longer than the room a microbatch has left is cut into pieces in consecutive
microbatches (:mod:`trainer_adapter.train.microbatches`). Its later pieces attend to the earlier ones,
as causal attention over the whole sample does: each stage keeps, per layer, the keys and values
of the last piece it ran (:class:`SampleCarry`), and the next microbatch's first segment, when it
continues that sample, attends to them as a prefix.

Gradient: a later piece hands its prefix a leaf copy of the earlier keys and values; the
gradient that collects there is added to the earlier piece's keys and values by a tensor hook
when that piece's backward reaches them. That needs the later piece's backward first, so a
*chain* (rows joined by cut samples) runs its forwards in row order and its backwards in reverse
(:class:`ChainSchedule`: the chosen schedule — GPipe, 1F1B, interleaved 1F1B — computed over
chains as units, then each unit expanded into its rows; run by ``torch.distributed.pipelining``'s
runtime, which adds the sends and receives). A hook that finds a later piece's gradient missing
raises instead of producing a wrong gradient.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["ChainSchedule", "SampleCarry", "chain_actions", "unit_order"]


class _Piece:
    """One piece's keys and values at one layer, as the piece's own graph made them."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv = (k, v)
        self.uses: list[tuple[torch.Tensor, torch.Tensor]] = []  # leaf copies given out
        self._hooked = False

    def use(self) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.kv
        if not k.requires_grad:  # no graph (evaluation): nothing to route back
            return k, v
        if not self._hooked:
            k.register_hook(functools.partial(self._add, 0))
            v.register_hook(functools.partial(self._add, 1))
            self._hooked = True
        leaf = (k.detach().requires_grad_(), v.detach().requires_grad_())
        self.uses.append(leaf)
        return leaf

    def _add(self, j: int, grad: torch.Tensor) -> torch.Tensor:
        extra = [u[j].grad for u in self.uses]
        if any(g is None for g in extra):
            raise RuntimeError(
                "the backward of a cut sample's earlier piece ran before a later piece's: a "
                "chain's microbatches must run backward in reverse order (ChainSchedule)"
            )
        return grad + sum(extra)


class SampleCarry:
    """Per stage: the keys and values of the sample whose piece ended the last microbatch and
    goes on in the next one (one list of per-layer pieces per microbatch it spans so far)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sample: int | None = None
        self.pieces: list[list[_Piece]] = []

    def continues(self, sample: int) -> bool:
        return self.sample == sample and bool(self.pieces)

    def prefix(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The carried sample's keys and values at ``layer``: [heads, tokens so far, d] each."""
        uses = [chunk[layer].use() for chunk in self.pieces]
        return torch.cat([u[0] for u in uses], 1), torch.cat([u[1] for u in uses], 1)

    def push(self, sample: int | None, kvs: list | None, *, extends: bool) -> None:
        """After a microbatch: ``sample``'s piece goes on in the next one (None: nothing goes
        on); ``extends``: the piece continues the carried sample (it filled the whole row)."""
        if sample is None:
            self.reset()
            return
        pieces = [_Piece(k, v) for k, v in kvs]
        if extends:
            self.pieces.append(pieces)
        else:
            self.sample, self.pieces = sample, [pieces]


def chain_actions(unit_order: dict, chains: tuple[int, ...]) -> dict:
    """Expand a schedule computed over chains as units into microbatch actions: a unit's
    forward runs its rows in order, its backward in reverse order. ``unit_order``: rank ->
    list of ``_Action`` (or None) over unit indices."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    starts = [sum(chains[:u]) for u in range(len(chains))]
    out = {}
    for rank, actions in unit_order.items():
        ops = []
        for a in actions:
            if a is None:
                continue
            if a.computation_type not in (_ComputationType.FORWARD, _ComputationType.FULL_BACKWARD):
                raise ValueError(f"chain schedules expand F and B actions only, got {a}")
            rows = range(
                starts[a.microbatch_index], starts[a.microbatch_index] + chains[a.microbatch_index]
            )
            if a.computation_type == _ComputationType.FULL_BACKWARD:
                rows = reversed(rows)
            ops.extend(_Action(a.stage_index, a.computation_type, m) for m in rows)
        out[rank] = ops
    return out


def _single_stage_order(name: str, pp: int, n: int) -> dict:
    """GPipe or 1F1B over ``n`` units, one stage per rank (stage index = rank)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    F, B = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
    order = {}
    for s in range(pp):
        if name == "gpipe":
            ops = [(F, i) for i in range(n)] + [(B, i) for i in range(n)]
        else:  # 1f1b: warm-up forwards, then one backward, one forward; then the backwards left
            w = min(n, pp - s)
            ops, f = [(F, i) for i in range(w)], w
            for b in range(n):
                ops.append((B, b))
                if f < n:
                    ops.append((F, f))
                    f += 1
        order[s] = [_Action(s, c, i) for c, i in ops]
    return order


def _merge_for_interleaved(chains: tuple[int, ...], pp: int) -> tuple[int, ...]:
    """torch's interleaved 1F1B needs the number of (unit) microbatches divisible by its rounds
    (units // pp); merge the smallest neighbouring units until it is."""
    units = list(chains)
    while len(units) > pp and len(units) % max(1, len(units) // pp):
        j = min(range(len(units) - 1), key=lambda i: units[i] + units[i + 1])
        units[j : j + 2] = [units[j] + units[j + 1]]
    return tuple(units)


def unit_order(name: str, chains: tuple[int, ...], stages: list) -> tuple[dict, tuple[int, ...]]:
    """The named schedule over the chains as units: rank -> actions over unit indices, and the
    units (interleaved 1F1B may merge neighbouring chains so torch's order exists)."""
    pp = stages[0].group_size
    if name != "interleaved1f1b":
        return _single_stage_order(name, pp, len(chains)), chains
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    chains = _merge_for_interleaved(chains, pp)
    # only its order is used: the object's stages are never run by it
    return ScheduleInterleaved1F1B(stages, len(chains), scale_grads=False).pipeline_order, chains


class ChainSchedule:
    """A pipeline schedule for microbatches whose chains must run backward in reverse: the
    named schedule computed over the step's chains as units and expanded into rows, run by
    ``torch.distributed.pipelining``'s runtime (which adds the sends and receives). The same
    stage objects serve every step; the order is lowered again when the chains change."""

    def __init__(self, name: str, stages: list, n_microbatches: int, loss_fn) -> None:
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        self.name, self.stages, self.n_microbatches = name, stages, n_microbatches
        self.runtime = _PipelineScheduleRuntime(
            stages, n_microbatches, loss_fn=loss_fn, scale_grads=False
        )
        self._chains: tuple[int, ...] | None = None

    def set_chains(self, chains: tuple[int, ...]) -> None:
        if sum(chains) != self.n_microbatches:
            raise ValueError(f"chains {chains} do not cover {self.n_microbatches} microbatches")
        if chains != self._chains:
            order, units = unit_order(self.name, tuple(chains), self.stages)
            for st in self.stages:  # building an interleaved order re-maps the stages
                st.stage_index_to_group_rank = self.runtime.stage_index_to_group_rank
            self.runtime._prepare_schedule_with_comms(chain_actions(order, units))
            self._chains = tuple(chains)

    def step(self, *args, **kwargs):
        if self._chains is None:
            raise RuntimeError("set_chains() before step()")
        return self.runtime.step(*args, **kwargs)
