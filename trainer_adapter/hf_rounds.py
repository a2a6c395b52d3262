"""What every balanced vision tower shares (:mod:`trainer_adapter.hf_balance`,
:mod:`trainer_adapter.hf_pixtral`): its cost model, and its exchange rounds.

Each call of a balanced tower is one exchange round that every rank of the group must take
part in. A model calls its tower once per modality it has this step (Qwen2-VL: images, then
videos), so ranks call it 0, 1 or 2 times; a rank joins the rounds it did not start itself
(``equishard_join``: a call with no images of its own) until a round in which no rank brought
images (``equishard_settle``). A tower's own call without images makes no round at all. A model
with two towers that it calls one after the other for the same images (DeepSeek-VL's hybrid:
its low- and high-resolution towers) settles them in that order, round by round
(:func:`settle_together`), so that every rank's exchanges come in the same order.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np
import torch

from balancing import CostModel
from trainer_adapter.hf_packing import call_settings
from trainer_adapter.item_exchange import ItemRoute, plan_items
from trainer_adapter.item_outputs import output_anchor, runs_everywhere, zero_of
from trainer_adapter.redistribute import RedistributePolicy

__all__ = [
    "install",
    "joined",
    "length_cost",
    "plan_round",
    "record",
    "settle_together",
    "tower_cost",
]


def tower_cost(tower: torch.nn.Module, policy: RedistributePolicy) -> CostModel:
    """The encoder cost model from the tower's own size (its config), else the policy's."""
    cfg = getattr(tower, "config", None)
    hidden = getattr(cfg, "embed_dim", None) or getattr(cfg, "hidden_size", None)
    layers = getattr(cfg, "depth", None) or getattr(cfg, "num_hidden_layers", None)
    if hidden and layers:
        return CostModel.from_dims(vit_hidden=hidden, vit_layers=layers, llm_hidden=1, llm_layers=1)
    return policy.cost_model


def length_cost(phase, policy: RedistributePolicy) -> Callable[[np.ndarray], np.ndarray]:
    """Per item of an item table whose column 0 is its length: ``alpha*n + beta*n^2`` with
    the phase's coefficients (``policy.cost == "modeled"``), else ``n``."""

    def cost(table: np.ndarray) -> np.ndarray:
        n = table[:, 0].astype(np.float64)
        return phase.alpha * n + phase.beta * n * n if policy.cost == "modeled" else n

    return cost


def joined(tower: torch.nn.Module, *args, **kwargs) -> torch.Tensor:
    """The tower called only to take part in a round (no images of this rank's own); in a
    round without any image anywhere there is no exchange and the tower does not run (it may
    not take an empty batch): a zero tied to its parameters."""
    tower.equishard_joining = True
    try:
        out = tower(*args, **kwargs)
    finally:
        tower.equishard_joining = False
    return output_anchor(tower) if out is None else zero_of(out)


def record(tower: torch.nn.Module, route) -> None:
    """Note a round: ``last_route`` is the latest round of the step that moved any images
    (the terminal empty round of :func:`_settle` does not hide it)."""
    if route.items or not tower.equishard_step_images:
        tower.last_route = route
    tower.equishard_step_images |= bool(route.items)
    tower.equishard_round_images = route.items


def plan_round(
    tower: torch.nn.Module, table, cost, volume, *, group, topology, policy, refusal, where, kwargs
) -> ItemRoute:
    """One exchange round of a balanced tower: :func:`~trainer_adapter.item_exchange.plan_items`
    over this rank's item table (or its ``refusal``, raised on every rank), the ranks agreeing
    on the settings of the call's ``kwargs``; recorded on the tower."""
    route = plan_items(
        table,
        cost,
        group=group,
        topology=topology,
        policy=policy,
        volume=volume,
        refusal=refusal,
        where=where,
        settings=call_settings(kwargs),
        idle=runs_everywhere(tower, policy),
    )
    record(tower, route)
    return route


def _settle(tower: torch.nn.Module) -> torch.Tensor:
    """Join rounds until one in which no rank brought images: every rank is then past its own
    calls, and all stop together, after as many rounds as the busiest rank's calls. Called by
    the balanced decoder before its own exchange (with a tower alone, call
    ``tower.equishard_settle()`` on every rank after the step's tower calls); returns the sum
    of the joined rounds' zeros, to be added to an output so their reverse exchanges run in
    the backward."""
    zero = None
    while True:
        z = tower.equishard_join()
        zero = z if zero is None else zero + z
        if tower.equishard_round_images == 0:
            break
    tower.equishard_step_images = False
    return zero


def settle_together(towers: list) -> torch.Tensor | None:
    """:func:`_settle` for towers a model calls one after the other on the same images: one
    round of each, in that order, until a round in which no rank brought images (a rank that
    called them joins after its calls, one that did not joins them all in the same order)."""
    if len(towers) == 1:
        return towers[0].equishard_settle()
    zero = None
    while True:
        busy = False
        for tower in towers:
            z = tower.equishard_join()
            zero = z if zero is None else zero + z
            busy |= tower.equishard_round_images != 0
        if not busy:
            break
    for tower in towers:
        tower.equishard_step_images = False
    return zero


def install(tower: torch.nn.Module, forward, join) -> torch.nn.Module:
    """Put the balanced ``forward``, ``equishard_join`` (one round with no images of this
    rank's own) and ``equishard_settle`` (:func:`_settle`) on the tower instance; its
    parameters and state dict stay as they are. While ``tower.equishard_paused`` (see
    :func:`~trainer_adapter.hf_balance.paused`) the tower's own forward runs, with no round."""
    tower.equishard_joining = False
    tower.equishard_step_images = False
    tower.equishard_round_images = 0
    tower.equishard_paused = False
    own = tower.forward

    def gated(self, *args, **kwargs):
        if self.equishard_paused:
            return own(*args, **kwargs)
        return forward(self, *args, **kwargs)

    tower.forward = types.MethodType(gated, tower)
    tower.equishard_join = types.MethodType(join, tower)
    tower.equishard_settle = types.MethodType(_settle, tower)
    return tower
