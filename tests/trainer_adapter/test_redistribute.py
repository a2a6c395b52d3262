"""Runtime redistribution over real gloo process groups: nothing lost, nothing hangs, and the
node-wise permutation keeps bytes inside nodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.dist_helper import run_ranks
from tests.trainer_adapter.synthetic import per_sample, synthetic_batch
from trainer_adapter import RedistributePolicy

COUNTS = {4: [5, 0, 2, 9], 2: [0, 6], 3: [7, 1, 0]}


def _redistribute(rank, world, counts, policy_kw, ranks_per_node):
    from trainer_adapter import RedistributePolicy, Topology, redistribute

    batch = synthetic_batch(rank, counts[rank], big=True)
    local, route = redistribute(
        batch, None, Topology(ranks_per_node=ranks_per_node), RedistributePolicy(**policy_kw)
    )
    llm_cu = local.cu_seqlens.tolist()
    # image-token embeddings carry their sample's global index; check them on arrival
    n_img = route.table[local.vision_index, 3]
    emb = torch.repeat_interleave(
        torch.tensor(local.vision_index, dtype=torch.float32), torch.from_numpy(n_img)
    )[:, None].repeat(1, 3)
    emb.requires_grad_(True)
    got = route.send_image_embeddings(emb)
    (got * (got.detach() + 1)).sum().backward()
    back = route.to_source(torch.tensor(local.llm_index, dtype=torch.float32)[:, None])
    return {
        "llm_index": local.llm_index.tolist(),
        "vision_index": local.vision_index.tolist(),
        "ids": [
            local.input_ids[llm_cu[i] : llm_cu[i + 1]].tolist() for i in range(len(llm_cu) - 1)
        ],
        "labels": [
            local.labels[llm_cu[i] : llm_cu[i + 1]].tolist() for i in range(len(llm_cu) - 1)
        ],
        "label_index": local.label_index.tolist(),
        "label_cu": local.label_cu_seqlens.tolist(),
        "cu": llm_cu,
        "patches": local.patches,
        "units": local.units_hw.tolist(),
        "img_in_llm_order": got.detach()[:, 0].tolist(),
        "emb_grad_ok": bool(torch.equal(emb.grad, emb.detach() + 1)),
        "to_source": back[:, 0].tolist(),
        "summary": route.summary(),
        "loads": {k: np.asarray(v).tolist() for k, v in route.loads.items()},
    }


@pytest.mark.parametrize("world", [2, 3, 4])
def test_uneven_counts_with_an_empty_rank_lose_nothing(world):
    counts = COUNTS[world]
    got = run_ranks(_redistribute, world, counts, {}, 1, timeout=120)
    src = [s for r in range(world) for s in per_sample(synthetic_batch(r, counts[r], big=True))]
    n = len(src)
    llm = [i for g in got for i in g["llm_index"]]
    assert sorted(llm) == list(range(n))  # each sample on exactly one LLM rank
    vis = [i for g in got for i in g["vision_index"]]
    with_images = [i for i, s in enumerate(src) if len(s["patches"])]
    assert sorted(vis) == with_images
    for g in got:
        for i, ids, labels in zip(g["llm_index"], g["ids"], g["labels"], strict=True):
            assert ids == src[i]["ids"] and labels == src[i]["labels"]
        # labels stay with the inputs here: the same samples, the same rows
        assert g["label_index"] == g["llm_index"] and g["label_cu"] == g["cu"]
        want = [src[i]["patches"] for i in g["vision_index"]]
        assert torch.equal(g["patches"], torch.cat(want) if want else torch.zeros(0, 12))
        assert g["units"] == [[2, 2]] * sum(len(src[i]["patches"]) // 4 for i in g["vision_index"])
        # image embeddings reached the LLM rank of their sample, in image-token order
        want_img = [float(i) for i in g["llm_index"] for t in src[i]["ids"] if t == 7]
        assert g["img_in_llm_order"] == want_img
        assert g["emb_grad_ok"]  # gradients came back through the same exchange
    # per-sample results routed back to the rank and position each sample came from
    offs = np.cumsum([0, *counts])
    for r, g in enumerate(got):
        assert g["to_source"] == [float(i) for i in range(offs[r], offs[r + 1])]
    s = got[0]["summary"]
    assert s["llm_after_max_over_mean"] < s["llm_before_max_over_mean"]
    same = [{k: v for k, v in g["summary"].items() if k != "seconds"} for g in got]
    assert all(x == same[0] for x in same)  # every rank computed the same plan


def test_disabled_moves_nothing():
    got = run_ranks(_redistribute, 4, COUNTS[4], {"enabled": False}, 2, timeout=120)
    offs = np.cumsum([0, *COUNTS[4]])
    for r, g in enumerate(got):
        assert g["llm_index"] == list(range(offs[r], offs[r + 1]))
    assert all(
        v == {"intra_node": 0.0, "inter_node": 0.0} for v in got[0]["summary"]["bytes"].values()
    )


def _counting_exchanges(rank, world, counts, policy_kw, ranks_per_node):
    """:func:`_redistribute`, counting the all_to_all calls this rank makes."""
    import torch.distributed as dist

    calls, a2a = [], dist.all_to_all_single

    def counted(*args, **kwargs):
        calls.append(1)
        return a2a(*args, **kwargs)

    dist.all_to_all_single = counted
    try:
        return {**_redistribute(rank, world, counts, policy_kw, ranks_per_node), "a2a": len(calls)}
    finally:
        dist.all_to_all_single = a2a


def test_dry_run_plans_as_balancing_and_moves_nothing():
    """``dry_run``: the loads the balanced run reaches are recorded as planned (the same plan),
    every sample stays where it was and no exchange runs at all (a plan that moves nothing
    skips the all_to_all on every rank). Bugs caught: a dry run that moves samples, plans
    differently from the balanced run, or still pays for the exchanges."""
    kw = {"method": "lpt", "cost": "tokens"}
    dry = run_ranks(_counting_exchanges, 4, COUNTS[4], {**kw, "dry_run": True}, 2, timeout=120)
    real = run_ranks(_counting_exchanges, 4, COUNTS[4], kw, 2, timeout=120)
    offs = np.cumsum([0, *COUNTS[4]])
    for r, g in enumerate(dry):
        assert g["llm_index"] == list(range(offs[r], offs[r + 1]))
        assert g["a2a"] == 0 and real[r]["a2a"] > 0
        assert g["to_source"] == [float(i) for i in range(offs[r], offs[r + 1])]
    loads, want = dry[0]["loads"], real[0]["loads"]
    for phase in ("vision", "llm"):
        assert loads[f"{phase}_before"] == want[f"{phase}_before"]
        assert loads[f"{phase}_after"] == loads[f"{phase}_before"]  # nothing moved
        assert loads[f"{phase}_planned"] == want[f"{phase}_after"] == want[f"{phase}_planned"]
        assert dry[0]["summary"]["methods"][phase].startswith("dry run")
    assert max(loads["llm_planned"]) < max(loads["llm_before"])
    with pytest.raises(ValueError, match="dry_run=True alone"):
        RedistributePolicy(enabled=False, dry_run=True)


def _dry_send(rank, world):
    from trainer_adapter.item_exchange import plan_items

    table = np.array([[2], [3]]) if rank == 0 else np.array([[1]])
    route = plan_items(table, lambda t: t[:, 0] * 1.0, policy=RedistributePolicy(dry_run=True))
    x = torch.arange(int(table.sum()) * 2, dtype=torch.float32).reshape(-1, 2)
    y = route.send(x, 0)
    y.add_(1)  # what a module does with its inputs must not reach the caller's tensor
    return bool(torch.equal(y - 1, x)), y.data_ptr() != x.data_ptr()


def test_a_send_that_moves_nothing_gives_a_tensor_of_its_own():
    """Skipping the exchange where nothing moves returns what the exchange would: the same rows
    in a tensor of their own. Bug caught: the caller's tensor handed back (an in-place change
    to a module's input would change the batch the caller holds)."""
    assert run_ranks(_dry_send, 2) == [(True, True), (True, True)]


def test_nodewise_permutation_lowers_inter_node_bytes():
    """2 nodes x 2 ranks: the same LPT batches, placed by Alg. 3 or as they come."""
    kw = {"method": "lpt", "cost": "tokens"}
    ident = run_ranks(_redistribute, 4, COUNTS[4], {**kw, "placement": "identity"}, 2)
    node = run_ranks(_redistribute, 4, COUNTS[4], {**kw, "placement": "nodewise"}, 2)

    def inter(res):
        return sum(v["inter_node"] for k, v in res[0]["summary"]["bytes"].items() if k == "tokens")

    assert sorted(ident[0]["loads"]["llm_after"]) == pytest.approx(
        sorted(node[0]["loads"]["llm_after"])
    )
    assert inter(node) < inter(ident)
    assert "milp" in node[0]["summary"]["methods"]["llm"]


def test_plan_is_deterministic():
    a = run_ranks(_redistribute, 3, COUNTS[3], {}, 1)
    b = run_ranks(_redistribute, 3, COUNTS[3], {}, 1)
    assert [g["llm_index"] for g in a] == [g["llm_index"] for g in b]
    assert [g["vision_index"] for g in a] == [g["vision_index"] for g in b]


def _gather(rank, world):
    from trainer_adapter.exchange import gather_tables

    local = np.arange(rank * 2 * 3).reshape(-1, 3) + 100 * rank
    return [t.tolist() for t in gather_tables(local)]


def test_gather_tables_with_uneven_and_empty_tables():
    got = run_ranks(_gather, 3)
    want = [(np.arange(r * 2 * 3).reshape(-1, 3) + 100 * r).tolist() for r in range(3)]
    assert all(g == want for g in got)


def test_policy_rejects_bad_settings():
    from trainer_adapter import RedistributePolicy, Topology

    with pytest.raises(ValueError, match="unknown method"):
        RedistributePolicy(method="fastest")
    with pytest.raises(ValueError, match="placement"):
        RedistributePolicy(placement="random")
    with pytest.raises(ValueError, match="ranks_per_node"):
        Topology(ranks_per_node=0)
    with pytest.raises(ValueError, match="split into nodes"):
        Topology(ranks_per_node=3).resolve(4)


def _traffic(rank, world, seeds):
    from trainer_adapter import RedistributePolicy, Topology, redistribute

    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        counts = rng.integers(0, 9, world)  # the same on every rank
        batch = synthetic_batch(rank, int(counts[rank]), seed=seed)
        row = []
        for embedding_bytes in (0, 256 * 4):
            policy = RedistributePolicy(
                method="lpt", cost="tokens", placement="nodewise", embedding_bytes=embedding_bytes
            )
            local, route = redistribute(batch, None, Topology(ranks_per_node=2), policy)
            n_img = int(route.table[local.vision_index, 3].sum())
            route.send_image_embeddings(torch.zeros(n_img, 256))  # 1 KiB per image token
            row.append(sum(v["inter_node"] for v in route.summary()["bytes"].values()))
        out.append(row)
    return out


def test_nodewise_placement_counts_the_image_embeddings_trip():
    """The LLM placement weighs each image's embeddings travelling from its encoder rank with
    the tokens travelling from the sample's rank: over all bytes actually sent, it never
    crosses nodes more than a placement that sees the tokens alone, and less where they differ
    (the node assignment is an exact MILP over the same batches)."""
    got = run_ranks(_traffic, 4, list(range(8)), timeout=300)[0]
    for seed, (blind, aware) in enumerate(got):
        assert aware <= blind + 1e-6, (seed, blind, aware)
    assert sum(a for _, a in got) < sum(b for b, _ in got)


@pytest.mark.parametrize("method", ["lpt", "locality"])
@pytest.mark.parametrize("min_gain", [0.0, 10.0])
def test_own_items_are_kept_only_where_they_hold_the_memory_cap(min_gain, method):
    """Rank 1 holds one long sample whose attention cost no placement can lower, rank 0 many
    short ones over the memory cap: keeping every rank's own samples (the max cost would not
    drop, or the gain is under ``min_gain``) would break the cap, so the capped placement runs
    and every rank ends under it. Without a cap, the ranks' own samples are kept."""
    from trainer_adapter import RedistributePolicy, Topology
    from trainer_adapter.redistribute import _plan_phase

    tokens = np.array([400.0] * 10 + [1700.0])  # rank 0: 4000 tokens, rank 1: one of 1700
    src = np.array([0] * 10 + [1])
    cost = tokens**2  # attention-bound: the long sample is the most expensive rank alone
    policy = RedistributePolicy(method=method, cost="tokens", min_gain=min_gain)
    cap = 3000  # locality's plan keeps rank 0's samples home (4000 tokens): over it
    dest, method, before, _ = _plan_phase(cost, src, [0, 1], Topology(), policy, tokens, cap=cap)
    held = np.bincount(dest, weights=tokens, minlength=2)
    assert held.max() <= cap, (method, held)
    assert not method.startswith("kept") and not np.array_equal(dest, src)
    assert before.argmax() == 1  # the long sample's rank was the costliest before
    kept, method, _, _ = _plan_phase(cost, src, [0, 1], Topology(), policy, tokens, cap=None)
    assert np.array_equal(kept, src), method  # locality keeps them by its own plan


@pytest.mark.parametrize(
    "min_gain, kept",
    [(0.0, False), (0.1, False), (0.2, False), (0.23, True), (1.0, True)],
)
def test_a_step_is_left_as_it_is_only_within_min_gain(min_gain, kept):
    """Reference model of the decision, worked by hand: rank 0 holds 8 + 3, rank 1 holds 5 + 2
    (loads 11 and 7: the heaviest 22 % over the mean of 9). Within ``1 + min_gain`` of the mean
    the ranks keep their items; otherwise the plan runs, and where it lowers the heaviest rank
    (the best split is 10 / 8) it is taken. Bugs: a threshold other than the documented one,
    a better plan thrown away ("kept" while LPT lowers the max)."""
    from trainer_adapter import RedistributePolicy, Topology
    from trainer_adapter.redistribute import _plan_phase

    cost = np.array([8.0, 3.0, 5.0, 2.0])
    src = np.array([0, 0, 1, 1])
    policy = RedistributePolicy(method="lpt", cost="tokens", min_gain=min_gain)
    dest, method, before, _ = _plan_phase(cost, src, [0, 1], Topology(), policy, cost)
    assert before.tolist() == [11.0, 7.0]
    if kept:
        assert method == "kept (within min_gain)" and np.array_equal(dest, src)
    else:
        assert not method.startswith("kept"), method
        assert np.bincount(dest, weights=cost, minlength=2).max() == 10.0


def test_locality_balances_inside_each_node_where_the_nodes_are_even():
    """``method="locality"`` moves a rank's excess inside its node first: two nodes of two ranks
    whose totals are equal balance without one item crossing a node (reference: the node of each
    item's rank before and after), while the same loads seen as one node of four send two."""
    from trainer_adapter import RedistributePolicy, Topology
    from trainer_adapter.redistribute import _plan_phase

    tokens = np.full(16, 100.0)
    src = np.array([0] * 6 + [1] * 2 + [2] * 7 + [3] * 1)  # node totals 800 and 800
    policy = RedistributePolicy(method="locality", cost="tokens")
    crossing = {}
    for per_node in (2, 4):
        topo = Topology(ranks_per_node=per_node)
        dest, method, _, _ = _plan_phase(tokens, src, [0, 1, 2, 3], topo, policy, tokens, cap=None)
        assert method == "locality"
        assert np.bincount(dest, weights=tokens, minlength=4).tolist() == [400.0] * 4
        crossing[per_node] = int(((dest // 2) != (src // 2)).sum())
    assert crossing[2] == 0 and crossing[4] > 0


def _split_labels(rank, world, counts):
    from trainer_adapter import RedistributePolicy, Topology, redistribute

    batch = synthetic_batch(rank, counts[rank], big=True)
    topo = Topology(llm_ranks=(0, 2), label_ranks=(1, 3))
    local, _ = redistribute(batch, None, topo, RedistributePolicy())
    cu = local.label_cu_seqlens.tolist()
    return {
        "llm_index": local.llm_index.tolist(),
        "label_index": local.label_index.tolist(),
        "labels": [local.labels[cu[i] : cu[i + 1]].tolist() for i in range(len(cu) - 1)],
    }


def test_labels_reach_the_rank_paired_with_their_llm_rank():
    """With labels on other ranks than the LLM inputs (a pipeline's last stage), LLM rank 0's
    samples have their labels on rank 1 and rank 2's on rank 3 (the pairing, by hand): each
    label rank holds exactly its partner's samples, each sample's labels as the source had them
    (bug: a rank's label_index named the samples it does not hold)."""
    counts = [5, 0, 2, 9]
    got = run_ranks(_split_labels, 4, counts, timeout=120)
    src = [s for r in range(4) for s in per_sample(synthetic_batch(r, counts[r], big=True))]
    assert got[1]["llm_index"] == got[3]["llm_index"] == []
    assert got[0]["label_index"] == got[2]["label_index"] == []
    assert got[1]["label_index"] == got[0]["llm_index"]
    assert got[3]["label_index"] == got[2]["llm_index"]
    assert sorted(got[1]["label_index"] + got[3]["label_index"]) == list(range(len(src)))
    for g in got:
        for i, labels in zip(g["label_index"], g["labels"], strict=True):
            assert labels == src[i]["labels"]
