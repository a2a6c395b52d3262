"""Copies for idle ranks (``plan_items(idle=True)``), on their own (no transformers): a rank the
plan gives no item runs a copy of one, so that every rank runs the module whenever any does
(FSDP2 sharded per block, ZeRO-3). The copy travels like an item, its result stays where it
was made, tied into the graph with a zero weight; the real items' results and gradients are
exactly those of a plan without copies. On real architectures under FSDP2: test_hf_fsdp.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist_helper import run_ranks
from trainer_adapter.item_exchange import idle_copies
from trainer_adapter.redistribute import RedistributePolicy


def test_idle_copies_prefers_the_ranks_own_cheapest_then_the_cheapest_of_all():
    cost = np.array([5.0, 1.0, 3.0, 2.0, 1.0])
    src = np.array([0, 0, 1, 2, 2])
    dest = np.array([0, 0, 1, 0, 0])  # rank 2's items moved away; ranks 2 and 3 receive none
    copy_of, to = idle_copies(cost, src, dest, 4)
    assert to.tolist() == [2, 3]
    # rank 2: its own cheapest (item 4: nothing to send); rank 3 brought nothing: the
    # cheapest of all, the first of the ties (item 1)
    assert copy_of.tolist() == [4, 1]
    copy_of, to = idle_copies(cost, src, np.array([0, 1, 2, 3, 0]), 4)
    assert copy_of.size == 0 and to.size == 0


def test_idle_ranks_policy_values():
    assert RedistributePolicy().idle_ranks == "auto"
    with pytest.raises(ValueError, match="idle_ranks must be"):
        RedistributePolicy(idle_ranks="always")


ROWS = {0: [2, 3, 1], 1: [4], 2: []}  # rows per item; rank 2 brings none


def rank_copies(rank, world, idle):
    """Items of 2, 3, 1 / 4 / no rows; the plan keeps them home (balancing off), so rank 2 is
    idle. Each rank runs a "module" (rows times its weight ``w``) on what it received and
    sends the results home."""
    import torch

    from trainer_adapter.item_exchange import plan_items

    table = np.array(ROWS[rank], dtype=np.int64).reshape(-1, 1)
    start = sum(sum(ROWS[r]) for r in range(rank))
    x = (torch.arange(int(table.sum()), dtype=torch.float64) + start + 1)[:, None]
    x = x.expand(-1, 2).clone().requires_grad_(True)
    w = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    route = plan_items(
        table,
        lambda t: t[:, 0].astype(float),
        policy=RedistributePolicy(enabled=False),
        idle=idle,
    )
    got = route.send(x, 0, "x")
    # a count per real item (what a caller without copies gives) works the same
    again = route.send(x.detach(), [n for r in range(world) for n in ROWS[r]], "x again")
    assert again.tolist() == got.tolist()
    # the module runs where items arrived (as run_received: a rank with none skips it)
    y = route.back(got * w if route.received.size else got, 0, "y")
    (y.sum() * 3).backward()
    return {
        "received": route.received.tolist(),
        "items": route.items,
        "copy_of": route.copy_of.tolist(),
        "got": got.detach().tolist(),
        "home": y.detach().tolist(),
        "x_grad": None if x.grad is None else x.grad.tolist(),
        "w_grad": None if w.grad is None else float(w.grad),
        "moved": route.moved,
        "own": route.own.tolist(),
        "summary": route.summary()["copies"],
    }


def test_copy_runs_on_the_idle_rank_and_changes_nothing_else():
    with_copies = run_ranks(rank_copies, 3, True)
    without = run_ranks(rank_copies, 3, False)
    # rank 2 receives a copy of the cheapest item (rank 0's third, of 1 row: global index 2),
    # appended after the 4 real items
    assert [r["copy_of"] for r in with_copies] == [[2]] * 3
    assert with_copies[2]["received"] == [4] and without[2]["received"] == []
    assert with_copies[2]["got"] == [[6.0, 6.0]]  # rank 0's row 6 (its rows are 1..6)
    for a, b in zip(with_copies, without, strict=True):
        assert a["items"] == b["items"] == 4
        assert a["moved"] == b["moved"] == 0  # the copy is not a move
        assert a["own"] == b["own"]
        # the real items' results and gradients: exactly as without the copy (the copy's
        # gradient, zero, added to its original's)
        assert a["home"] == b["home"]
        assert a["x_grad"] == b["x_grad"]
    assert with_copies[0]["x_grad"] == [[6.0, 6.0]] * 6
    # the module ran backward on the idle rank (its weight got a gradient, 0), not without
    assert with_copies[2]["w_grad"] == 0.0 and without[2]["w_grad"] is None
    assert with_copies[0]["summary"] == 1 and without[0]["summary"] == 0


def rank_detect(rank, world):
    import torch
    from torch.distributed.fsdp import fully_shard

    from trainer_adapter.item_outputs import runs_everywhere

    def model():
        return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))

    auto, skip, run = (RedistributePolicy(idle_ranks=v) for v in ("auto", "skip", "run"))
    plain, blocks = model(), model()
    fully_shard(blocks[0])  # one block sharded: its forward all-gathers
    return [runs_everywhere(m, p) for m in (plain, blocks) for p in (auto, skip, run)]


def test_auto_runs_idle_ranks_where_the_module_holds_fsdp2_units():
    assert run_ranks(rank_detect, 2) == [[False, False, True, True, False, True]] * 2
