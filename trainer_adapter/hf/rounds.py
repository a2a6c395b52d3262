"""What every balanced vision tower shares (:mod:`trainer_adapter.hf.balance`,
:mod:`trainer_adapter.hf.pixtral`): its cost model, and its exchange rounds.

Each call of a balanced tower is one exchange round that every rank of the group must take
part in. A model calls its tower once per modality it has this step (Qwen2-VL: images, then
videos), so ranks call it 0, 1 or 2 times; a rank joins the rounds it did not start itself
(``equishard_join``: a call with no images of its own) until a round in which no rank brought
images (``equishard_settle``). A tower's own call without images makes no round at all. A model
with two towers that it calls one after the other for the same images (DeepSeek-VL's hybrid:
its low- and high-resolution towers) settles them in that order, round by round
(:func:`settle_together`), so that every rank's exchanges come in the same order.

A model with towers for different inputs calls them one after the other (Qwen2.5-Omni's
thinker: its audio tower, then its vision tower for images and for videos). A rank without
recordings skips the audio tower, so before a tower's own round every tower the model calls
before it is settled (``equishard_before``: set by :func:`settle_in_order`'s owner, the
balanced decoder): on entry to the model's method that calls the tower
(:func:`settle_on_entry`: before FSDP2 gathers a tower sharded as one unit), else inside the
tower's call. A tower is settled once a step, and the decoder settles what is left, in the
model's order (:func:`settle_in_order`), so every rank takes each tower's rounds together.

A rank that joins a round with no images of its own receives into a buffer of its own shape,
so it takes the shape of one item row from the round's gathered table (:func:`shape_columns`,
:func:`group_row_shape`), not from its tower's config: a tower fed rows of another layout
(Kimi-K2.5's ``[C, p, p]`` patches, Molmo2's ``[patches, p*p*C]`` crops) would otherwise get
rows reinterpreted in the joining rank's shape. Ranks that bring rows of different shapes stop
the step on every rank.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np
import torch

from balancing import CostModel
from trainer_adapter.group_errors import raise_together
from trainer_adapter.hf.packing import call_settings
from trainer_adapter.item_exchange import ItemRoute, plan_items
from trainer_adapter.item_outputs import output_anchor, runs_everywhere, zero_of
from trainer_adapter.redistribute import RedistributePolicy

__all__ = [
    "group_row_shape",
    "install",
    "joined",
    "length_cost",
    "plan_round",
    "record",
    "settle_in_order",
    "settle_on_entry",
    "settle_together",
    "shape_columns",
    "tower_cost",
]

ROW_DIMS = 4  # the most dims of one item row's shape that an item table carries


def tower_cost(tower: torch.nn.Module, policy: RedistributePolicy) -> CostModel:
    """The encoder cost model from the tower's own size (its config), else the policy's; a
    calibrated policy's always (measured beats modeled)."""
    if policy.cost_model.calibrated:
        return policy.cost_model
    cfg = getattr(tower, "config", None)
    hidden = getattr(cfg, "embed_dim", None) or getattr(cfg, "hidden_size", None)
    layers = getattr(cfg, "depth", None) or getattr(cfg, "num_hidden_layers", None)
    if hidden and layers:
        return CostModel.from_dims(vit_hidden=hidden, vit_layers=layers, llm_hidden=1, llm_layers=1)
    return policy.cost_model


def length_cost(phase, policy: RedistributePolicy) -> Callable[[np.ndarray], np.ndarray]:
    """Per item of an item table whose column 0 is its length: ``alpha*n + beta*n^2 + gamma``
    with the phase's coefficients (``policy.cost == "modeled"``), else ``n``."""

    def cost(table: np.ndarray) -> np.ndarray:
        n = table[:, 0].astype(np.float64)
        return phase.of(n, n * n, 1.0) if policy.cost == "modeled" else n

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


def shape_columns(shape: tuple[int, ...], n: int) -> np.ndarray:
    """``n`` item-table rows that carry one item row's ``shape`` (its dims after the first):
    the number of dims, then the dims, 0-padded to :data:`ROW_DIMS`."""
    if len(shape) > ROW_DIMS:
        raise ValueError(
            f"rows of shape {tuple(shape)} have more than {ROW_DIMS} dims after the item's, "
            "more than a balanced tower moves; flatten them"
        )
    row = [len(shape), *(int(d) for d in shape), *[0] * (ROW_DIMS - len(shape))]
    return np.tile(np.array(row, dtype=np.int64), (n, 1))


def group_row_shape(route: ItemRoute, start: int, what: str, where: str) -> tuple[int, ...]:
    """The row shape every item of the round has, from the gathered table's
    :func:`shape_columns` at column ``start`` (``()`` in a round without items). Ranks that
    brought rows of different shapes: every rank raises naming each rank's (every rank calls
    this with the same table, so all raise or none does)."""
    cols = route.table[: route.items, start : start + 1 + ROW_DIMS]
    if not len(cols):
        return ()
    shape = lambda c: tuple(int(d) for d in c[1 : 1 + c[0]])  # noqa: E731
    if (cols != cols[0]).any():
        reasons: list[str | None] = [None] * route.route.world
        for r, c in zip(route.src[: route.items], cols, strict=True):
            reasons[int(r)] = f"{what} of shape {shape(c)}"
        raise_together(
            reasons,
            f"{where}: {what} of different shapes on different ranks, which one exchange "
            "cannot move (give every rank's tower inputs of one layout, as its processor makes "
            "them):",
        )
    return shape(cols[0])


def plan_round(
    tower: torch.nn.Module,
    table,
    cost,
    volume,
    *,
    group,
    topology,
    policy,
    refusal,
    where,
    kwargs,
    dtypes: dict | None = None,
) -> ItemRoute:
    """One exchange round of a balanced tower: :func:`~trainer_adapter.item_exchange.plan_items`
    over this rank's item table (or its ``refusal``, raised on every rank), the ranks agreeing
    on the settings of the call's ``kwargs`` and on the ``dtypes`` of its payloads (a rank
    joining without images receives pixels in the senders' dtype, not its parameters');
    recorded on the tower."""
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
        dtypes=dtypes,
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
    tower.equishard_settled = True
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
        tower.equishard_settled = True
    return zero


def _add(a, b):
    return b if a is None else a if b is None else a + b


def settle_in_order(groups: list[list]) -> torch.Tensor | None:
    """Settle the towers of a step in the order the model calls them (``groups``: towers a
    model calls one after the other on the same images, :func:`settle_together`), each group
    not settled yet this step (a later tower's own round settled the earlier ones: see
    :func:`settle_before`); then the next step starts unsettled. Every rank calls it once a
    step, before the decoder's exchange. Returns the joined rounds' zeros, those of earlier
    settles included, to be added to an output (their reverse exchanges run in the
    backward)."""
    zero = None
    for towers in groups:
        for tower in towers:
            zero = _add(zero, tower.equishard_pending)
            tower.equishard_pending = None
        if not all(t.equishard_settled for t in towers):
            zero = _add(zero, settle_together(towers))
    for towers in groups:
        for tower in towers:
            tower.equishard_settled = False
    return zero


def settle_before(tower: torch.nn.Module) -> None:
    """Before ``tower``'s own round: settle every tower the model calls before it that is not
    settled yet this step (a rank without that tower's inputs never called it), keeping the
    joined rounds' zeros for :func:`settle_in_order`."""
    for group in tower.equishard_before:
        if not all(t.equishard_settled for t in group):
            zero = settle_together(group)
            group[0].equishard_pending = _add(group[0].equishard_pending, zero)


def settle_on_entry(owner: torch.nn.Module, method: str, tower: torch.nn.Module) -> None:
    """Settle the towers the model calls before ``tower`` (:func:`settle_before`) on entry to
    ``owner.method``, the model's own method that calls it (Qwen2.5-Omni's
    ``get_image_features``), not only inside the tower's call: FSDP2 all-gathers a tower
    sharded as one unit before its forward starts, and a rank settling the earlier towers
    after that gather would meet the others' rounds in another order. Set on the instance;
    the class is untouched."""
    own = getattr(owner, method)

    def entered(*args, **kwargs):
        if not tower.equishard_paused:
            settle_before(tower)
        return own(*args, **kwargs)

    setattr(owner, method, entered)


def install(tower: torch.nn.Module, forward, join) -> torch.nn.Module:
    """Put the balanced ``forward``, ``equishard_join`` (one round with no images of this
    rank's own) and ``equishard_settle`` (:func:`_settle`) on the tower instance; its
    parameters and state dict stay as they are. While ``tower.equishard_paused`` (see
    :func:`~trainer_adapter.hf.balance.paused`) the tower's own forward runs, with no round."""
    tower.equishard_joining = False
    tower.equishard_step_images = False
    tower.equishard_round_images = 0
    tower.equishard_paused = False
    tower.equishard_settled = False  # this step's rounds are over (settle_in_order)
    tower.equishard_pending = None  # zeros of rounds joined before the decoder
    tower.equishard_before = []  # groups of towers the model calls before this one
    own = tower.forward

    def gated(self, *args, **kwargs):
        if self.equishard_paused:
            return own(*args, **kwargs)
        if not self.equishard_joining:
            settle_before(self)
        return forward(self, *args, **kwargs)

    tower.forward = types.MethodType(gated, tower)
    tower.equishard_join = types.MethodType(join, tower)
    tower.equishard_settle = types.MethodType(_settle, tower)
    return tower
