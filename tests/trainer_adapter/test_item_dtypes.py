"""Payload dtypes across ranks (``plan_items(dtypes=)``): a rank with no items of its own holds
an empty placeholder made in its own dtype (its parameters', its embeddings'), yet receives the
senders' rows. Before, it received bf16 bytes into a float32 buffer (gloo took the short
message: half the rows garbage) and in the backward sent float32 gradients to ranks expecting
bf16 (gloo aborted: "Received data size doesn't match"). Now the dtype travels in the item
table and the placeholder takes it; ranks giving one payload in different dtypes are refused
on every rank.

On real architectures: the common mixed-precision set-ups, a bf16 model fed the processor's
float32 pixels and a float32 model under ``torch.autocast`` (Qwen3-VL's deepstack features
then come out of the tower in bf16 while the embeddings they join stay float32), each over 4
gloo ranks with an empty rank that receives images: loss and gradients as without balancing."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.dist_helper import run_ranks

ROWS = {0: [3, 2], 1: [], 2: [1]}  # rows per item; rank 1 brings none


def exchange_rank(rank, world, given):
    """Rank 0 brings bf16 items, rank 2 ``given`` ones; rank 1 none, its placeholder float32.
    The plan sends rank 0's items to rank 1 (costs by rank); returns what rank 1 received and
    every rank's gradient (each received row times 3, summed, back home)."""
    import torch

    from trainer_adapter.item_exchange import plan_items
    from trainer_adapter.redistribute import RedistributePolicy

    dt = {0: torch.bfloat16, 1: None, 2: getattr(torch, given)}[rank]
    table = np.array(ROWS[rank], dtype=np.int64).reshape(-1, 1)
    n = int(table.sum())
    x = (torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 10 * rank + 1).to(
        dt or torch.float32
    )
    x.requires_grad_(True)
    try:
        route = plan_items(
            table,
            lambda t: t[:, 0].astype(float) ** 3,
            policy=RedistributePolicy(placement="identity"),
            dtypes={"x": dt},
        )
    except ValueError as e:
        return str(e)
    got = route.send(x, 0, "x")
    y = route.back(got * 3, 0, "y")
    y.float().sum().backward()
    return {
        "received": route.received.tolist(),
        "got_dtype": str(got.dtype),
        "got": got.detach().float().tolist(),
        "grad": x.grad.float().tolist(),
        "dtypes": {k: str(v) for k, v in route.dtypes.items()},
    }


def test_rank_without_items_receives_the_senders_dtype():
    runs = run_ranks(exchange_rank, 3, "bfloat16")
    assert all(r["dtypes"] == {"x": "torch.bfloat16"} for r in runs)
    idle = runs[1]
    assert idle["received"], "the plan must send rank 1 an item for this test"
    assert idle["got_dtype"] == "torch.bfloat16"
    # the rows rank 0 sent, intact (before: bf16 bytes read as float32)
    own0 = (np.arange(10, dtype=np.float32).reshape(5, 2) + 1).tolist()
    starts = {0: 0, 1: 3}
    for row_block, item in zip(_blocks(idle["got"], [ROWS[0][i] for i in idle["received"]]),
                               idle["received"], strict=True):  # fmt: skip
        a = starts[item]
        assert row_block == own0[a : a + ROWS[0][item]]
    # gradients came back to every rank that sent (3 per element), the backward did not abort
    assert runs[0]["grad"] == [[3.0, 3.0]] * 5 and runs[2]["grad"] == [[3.0, 3.0]]


def _blocks(rows: list, counts: list[int]) -> list[list]:
    out, at = [], 0
    for n in counts:
        out.append(rows[at : at + n])
        at += n
    return out


def test_ranks_giving_different_dtypes_refused_on_every_rank():
    runs = run_ranks(exchange_rank, 3, "float16")
    for message in runs:
        assert isinstance(message, str), "the exchange ran with two dtypes"
        assert "x in different dtypes" in message
        assert "x in torch.bfloat16" in message and "x in torch.float16" in message


# -- on real architectures ------------------------------------------------------------------

# family -> precision set-up; every layout here has an empty rank (rank 1)
CASES = {
    "qwen3vl": "autocast",  # deepstack features bf16, embeddings float32
    "qwen2vl": "bf16",
    "internvl": "bf16",
    "mistral3": "bf16",  # Pixtral: images of their own sizes
    "lfm2vl": "bf16",  # NaFlex: padded patch rows
    "gemma4": "bf16",  # patch rows with positions
}


def model_rank(rank, world, family, how):
    """One step of ``family`` balanced and one without, in the precision set-up ``how``: the
    loss and gradients summed over ranks, and whether a rank without images of its own
    received some."""
    import torch
    import torch.distributed as dist

    from tests.trainer_adapter.test_hf_parity import build_model, make_batches
    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.redistribute import RedistributePolicy

    out = {}
    for mode in ("balanced", "plain"):
        model = build_model(family)
        batch = make_batches(family, model, None)[rank]
        # the processor's pixels are float32; the model bf16, or float32 under autocast
        batch = {
            k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in batch.items()
        }
        model = model.to(torch.bfloat16 if how == "bf16" else torch.float32)
        policy = RedistributePolicy(enabled=mode == "balanced", placement="identity")
        balance_model(model, encoder=True, llm=True, policy=policy)
        n = global_targets(batch["labels"])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=how == "autocast"):
            loss = model(**batch, num_items_in_batch=n, use_cache=False).loss
        loss.backward()
        loss = loss.detach().float().reshape(1)
        dist.all_reduce(loss)
        params = sorted(model.named_parameters())
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).float().reshape(-1)
             for _, p in params]
        )  # fmt: skip
        dist.all_reduce(flat)
        inner = model.model
        tower = getattr(inner, "visual", None) or inner.vision_tower
        route = tower.last_route
        idle_received = bool(route.own.size == 0 and route.received.size)
        flag = torch.tensor([int(idle_received)])
        dist.all_reduce(flag)
        out[mode] = (float(loss), flat.numpy(), int(flag), route.moved)
    return out


@functools.cache
def model_runs(family: str) -> dict:
    return run_ranks(model_rank, 4, family, CASES[family], timeout=300)[0]


@pytest.mark.parametrize("family", list(CASES))
def test_mixed_precision_with_an_empty_rank_as_without_balancing(family):
    pytest.importorskip("transformers")
    runs = model_runs(family)
    loss, grads, idle_received, moved = runs["balanced"]
    loss0, grads0, _, moved0 = runs["plain"]
    assert moved > 0 and moved0 == 0
    assert idle_received, "no rank without images received any: the case is not exercised"
    # bf16 arithmetic: other batch compositions round differently, nothing more
    assert loss == pytest.approx(loss0, rel=1e-4)
    assert np.abs(grads - grads0).max() <= 2e-2 * np.abs(grads0).max()
    assert np.abs(grads).sum() > 0


def volume_rank(rank, world):
    """Rank 0 brings items whose bytes are not their cost; rank 1 none. Each rank's
    ``volume`` sizes a row from its own payload, as the balanced towers do: rank 1's
    placeholder gives 0 bytes a row. Returns the plan this rank made."""
    from trainer_adapter.item_exchange import plan_items
    from trainer_adapter.redistribute import RedistributePolicy
    from trainer_adapter.topology import Topology

    # (cost, rows): two heavy items of few rows, the rest light with many
    items = [(9, 1), (9, 1), (3, 40), (3, 40), (3, 40)] if rank == 0 else []
    table = np.array(items, dtype=np.int64).reshape(-1, 2)
    row_bytes = 16 if rank == 0 else 0  # a rank without rows cannot size one
    route = plan_items(
        table,
        lambda t: t[:, 0].astype(float),
        volume=lambda t: t[:, 1] * float(row_bytes),
        topology=Topology(),
        policy=RedistributePolicy(min_gain=0.0),
    )
    return {"dest": route.dest.tolist(), "moved": route.moved}


def test_ranks_agree_on_the_plan_when_only_senders_know_the_bytes():
    """Before, each rank weighed the node-wise placement by its own ``volume``: the rank
    without items by 0 bytes, so the ranks placed the balanced bins on different ranks (the
    GLM-4.1V video round: a rank ran rows it never received, a grid of garbage). Now each
    item carries the bytes its own rank gives it: one plan on every rank, the heavy bytes
    kept on the rank that holds them."""
    runs = run_ranks(volume_rank, 2)
    assert runs[0]["dest"] == runs[1]["dest"]
    dest = np.array(runs[0]["dest"])
    assert runs[0]["moved"] > 0 and set(dest.tolist()) == {0, 1}
    rows = np.array([1, 1, 40, 40, 40])
    kept = rows[dest == 0].sum()
    assert kept >= rows[dest == 1].sum()  # the bin with more bytes stayed home
