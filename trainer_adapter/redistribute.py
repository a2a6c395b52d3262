"""Runtime DP redistribution (OrchMLLM §5–6): even out the samples of all ranks, per phase.

``redistribute`` runs on every rank of a process group with the rank's collated batch
(:class:`shards.Collator` output):

1. all_gather the per-sample lengths only (LLM tokens, encoder patches, tiles and their grids,
   image tokens, target tokens) — never the payload;
2. on every rank, the same plan per phase with ``balancing``'s runtime kernels: the vision plan
   over each sample's encoder cost for the ``vision_ranks``, the LLM plan over its LLM cost for
   the ``llm_ranks`` (identical input gives an identical plan, so nothing else is agreed on);
3. the node-wise permutation (OrchMLLM Alg. 3) for ``Topology.ranks_per_node``, so most bytes
   that move stay inside a node;
4. one all_to_all per phase moves only what changes rank: patches to their encoder rank, token
   ids (and labels) to their LLM rank.

Encoder outputs then go straight from the encoder rank to the sample's LLM rank with
:meth:`Route.send_image_embeddings` — one exchange per encoder pass, not two (rearrangement
composition) — and autograd carries their gradients back the same way. Ranks may hold any
number of samples, zero included. Data arrive in global sample order (source rank, then index).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from balancing import CostModel, locality_balance, nodewise_permutation, post_balance
from balancing.post_balance import LOCALITY, RUNTIME_METHODS, MemoryCapError
from equishard.common.values import check_count, check_flag, check_real
from trainer_adapter.exchange import gather_tables
from trainer_adapter.route import (
    _IMG,
    _LLM,
    _TOKEN_BYTES,
    _UNITS,
    _VIT,
    LocalBatch,
    Route,
    _cu,
)
from trainer_adapter.topology import Topology

__all__ = ["LocalBatch", "RedistributePolicy", "Route", "redistribute"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RedistributePolicy:
    """How to balance. ``method``: a ``balancing.post_balance`` method or ``locality`` (balance
    while keeping samples on their rank, overflow inside the node first). ``placement``:
    ``nodewise`` (Alg. 3) or ``identity``. ``cost``: ``modeled`` (alpha*len + beta*len^2 per
    phase, from ``cost_model``) or ``tokens``. A phase whose current max/mean is already within
    ``1 + min_gain`` is left as it is. ``enabled=False`` moves nothing (the baseline).
    ``dry_run``: plan as balancing would, run every check it runs, then move nothing: every
    item stays on its rank (no exchange; the small gather of per-item lengths still runs) and
    the route records the loads the ranks have and the loads the plan would have given
    (``*_planned``): what an unbalanced run would have gained, measured on its own steps.
    ``idle_ranks`` (the Hugging Face wrappers, :mod:`trainer_adapter.hf.balance`): what a rank
    that receives no item of a balanced module does: ``skip`` it (DDP), ``run`` it on a copy
    of one item and drop the results (FSDP2 sharded per block, ZeRO-3: a sharded block's
    forward and backward are collectives every rank must join), ``auto``: ``run`` where the
    module holds ``fully_shard`` units, else ``skip``."""

    enabled: bool = True
    method: str = "auto"
    placement: str = "nodewise"
    cost: str = "modeled"
    cost_model: CostModel = field(default_factory=CostModel)
    min_gain: float = 0.0
    llm_memory_cap: int | None = None
    # bytes of one image-token embedding (hidden x element size): with it, the LLM phase's
    # node-wise placement counts the embeddings' trip from encoder rank to LLM rank too
    embedding_bytes: int = 0
    idle_ranks: str = "auto"
    dry_run: bool = False

    def __post_init__(self) -> None:
        check_flag("enabled", self.enabled)
        check_flag("dry_run", self.dry_run)
        if self.dry_run and not self.enabled:
            raise ValueError(
                "dry_run=True plans without moving and enabled=False does not plan: give "
                "dry_run=True alone to measure what balancing would give, enabled=False alone "
                "for the plain baseline"
            )
        if self.method not in RUNTIME_METHODS:
            raise ValueError(
                f"unknown method {self.method!r}; choose one of {', '.join(RUNTIME_METHODS)}"
            )
        if self.placement not in ("nodewise", "identity"):
            raise ValueError(f"placement must be 'nodewise' or 'identity', got {self.placement!r}")
        if self.idle_ranks not in ("auto", "run", "skip"):
            raise ValueError(
                f"idle_ranks must be 'auto', 'run' or 'skip', got {self.idle_ranks!r} ('run' "
                "for modules sharded per block by FSDP2 or ZeRO-3)"
            )
        if self.cost not in ("modeled", "tokens"):
            raise ValueError(f"cost must be 'modeled' or 'tokens', got {self.cost!r}")
        check_count("embedding_bytes", self.embedding_bytes)
        check_real("min_gain", self.min_gain)
        check_count("llm_memory_cap (tokens)", self.llm_memory_cap, 1, none=True)


def _phase_costs(table: np.ndarray, units: list[np.ndarray], policy: RedistributePolicy):
    llm = table[:, _LLM].astype(np.float64)
    vit = table[:, _VIT].astype(np.float64)
    if policy.cost == "tokens":
        return vit, llm
    lens = np.concatenate([u[:, 0] * u[:, 1] for u in units]).astype(np.float64)
    owner = np.repeat(np.arange(table.shape[0]), table[:, _UNITS])
    sq = np.bincount(owner, weights=lens * lens, minlength=table.shape[0])
    cm = policy.cost_model
    return cm.vision.of(vit, sq, table[:, _UNITS]), cm.llm.of(llm, llm * llm, 1.0)


def _per_node(ranks: tuple[int, ...], topo: Topology) -> int | None:
    """Ranks of the phase per node, when they split into whole, equal, consecutive nodes."""
    nodes = np.array([topo.node_of(r) for r in ranks])
    uniq, counts = np.unique(nodes, return_counts=True)
    if len(set(counts.tolist())) != 1 or not np.array_equal(nodes, np.repeat(uniq, counts[0])):
        return None
    return int(counts[0])


def _extra_sources(extra, ranks, topo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item, phase-rank index, bytes) of payload that reaches an item's destination from
    another rank than its own (an image's embeddings from its encoder rank): each source is
    stood in for by a rank of this phase on the same node (the node is what the placement
    weighs); sources on nodes without such a rank are left out."""
    e_src, e_bytes = extra
    on_node = {}
    for j, r in enumerate(ranks):
        on_node.setdefault(topo.node_of(r), j)
    where = {r: j for j, r in enumerate(ranks)}
    idx = np.array(
        [where.get(int(r), on_node.get(topo.node_of(int(r)), -1)) if r >= 0 else -1 for r in e_src],
        dtype=np.int64,
    )
    ok = np.flatnonzero((idx >= 0) & (e_bytes > 0))
    return ok, idx[ok], e_bytes[ok].astype(np.float64)


def _plan_phase(cost, src, ranks, topo, policy, volume, cap=None, traffic=None):
    """Destination rank of each item, the method that ran, the loads of the phase's ranks
    before, and the loads the plan gives. Under ``policy.dry_run`` every item stays on its rank
    (the plan's loads are what it would have given; a plan the memory cap refuses, the loads
    before, the method saying why)."""
    if policy.dry_run:
        outside = np.setdiff1d(src, ranks).tolist()
        if outside:
            raise ValueError(
                f"dry_run keeps every item on its rank, but ranks {outside} hold items and take "
                f"no part in this phase (its ranks: {tuple(ranks)}); dry-run a topology whose "
                "phases run on every rank"
            )
    try:
        dest, method, before = _plan(cost, src, ranks, topo, policy, volume, cap, traffic)
    except MemoryCapError as e:  # a dry run measures: no plan under the cap is a finding
        if not policy.dry_run:
            raise
        dest, method = np.asarray(src, dtype=np.int64), f"no plan under the memory cap: {e}"
        before = np.bincount(_phase_index(dest, ranks), weights=cost, minlength=len(ranks))
    planned = np.bincount(_phase_index(dest, ranks), weights=cost, minlength=len(ranks))
    if not policy.dry_run:
        return dest, method, before, planned
    return np.asarray(src, dtype=np.int64).copy(), f"dry run ({method})", before, planned


def _phase_index(r: np.ndarray, ranks) -> np.ndarray:
    """Each of ``r`` (ranks of the phase) as its place in ``ranks``."""
    r = np.asarray(r, dtype=np.int64)
    lut = np.full(max(max(ranks), int(r.max(initial=0))) + 1, -1, dtype=np.int64)
    lut[list(ranks)] = np.arange(len(ranks))
    return lut[r]


def _plan(cost, src, ranks, topo, policy, volume, cap=None, traffic=None):
    """Destination rank of each item and the method that ran, and the loads before. ``traffic``
    (bytes per item from its own rank, and (source rank, bytes) per item from elsewhere) is what
    the node-wise placement keeps inside nodes; by default ``volume`` from the item's rank."""
    ranks_arr = np.asarray(ranks, dtype=np.int64)
    where = {r: j for j, r in enumerate(ranks)}
    src_j = np.array([where.get(int(s), -1) for s in src], dtype=np.int64)
    d = len(ranks)
    before = np.bincount(src_j[src_j >= 0], weights=cost[src_j >= 0], minlength=d)
    identity_ok = bool((src_j >= 0).all())
    if not policy.enabled or src.size == 0:
        if not identity_ok:
            raise ValueError(
                f"redistribution is off but ranks {sorted(set(src[src_j < 0].tolist()))} hold "
                f"samples and take no part in this phase (its ranks: {ranks})"
            )
        return ranks_arr[src_j] if src.size else src.copy(), "identity", before
    # keeping the ranks' own items is an option only where it holds the memory cap
    mem = volume if volume is not None else cost
    fits = identity_ok and (not cap or np.bincount(src_j, weights=mem, minlength=d).max() <= cap)
    if fits and before.mean() > 0 and before.max() <= before.mean() * (1 + policy.min_gain):
        return ranks_arr[src_j], "kept (within min_gain)", before
    per_node = _per_node(ranks, topo)
    if policy.method == LOCALITY and identity_ok:
        pb = locality_balance(cost, src_j, d, per_node or d)
        if not cap or np.bincount(pb.dest, weights=mem, minlength=d).max() <= cap:
            return ranks_arr[pb.dest], pb.method, before
        # locality moves only the excess and cannot see a memory cap: the capped plan instead
    method = "lpt" if policy.method == LOCALITY else policy.method
    pb = post_balance(cost, d, method=method, memory_cap=cap, memory=volume if cap else None)
    if fits and pb.loads.max() >= before.max():
        return ranks_arr[src_j], f"kept ({pb.method} would not lower the max)", before
    batch_rank = np.arange(d)
    name = pb.method
    if policy.placement == "nodewise" and identity_ok and per_node is not None:
        items, dests, weights = src_j, pb.dest, volume.astype(np.float64)
        if traffic is not None:
            own, extra = traffic
            k, e_src, e_bytes = _extra_sources(extra, ranks, topo)
            items = np.concatenate([src_j, e_src])
            dests = np.concatenate([pb.dest, pb.dest[k]])
            weights = np.concatenate([np.asarray(own, dtype=np.float64), e_bytes])
        nw = nodewise_permutation(items, dests, weights, d, per_node)
        batch_rank = nw.rank_of_batch
        name += f" + {nw.method}"
    return ranks_arr[batch_rank[pb.dest]], name, before


def redistribute(
    batch: dict,
    process_group: dist.ProcessGroup | None,
    topology: Topology,
    policy: RedistributePolicy,
) -> tuple[LocalBatch, Route]:
    """Balance the batches of all ranks; see the module docstring. Call on every rank."""
    t0 = time.perf_counter()
    rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    vision_ranks, llm_ranks, label_ranks = topology.resolve(world)
    llm_lens = batch["llm_lens"].numpy().astype(np.int64)
    cu = batch["cu_seqlens"].numpy().astype(np.int64)
    labels = batch["labels"]
    # next-token targets: a label counts unless it is the first token of its sample
    is_target = (labels != -100).numpy().astype(np.int64)
    is_target[cu[:-1][llm_lens > 0]] = 0
    targets = np.add.reduceat(is_target, cu[:-1]) if llm_lens.size else llm_lens
    targets = np.where(llm_lens > 0, targets, 0)
    img = (
        np.add.reduceat((batch["input_ids"] == batch["image_token_id"]).numpy(), cu[:-1])
        if llm_lens.size
        else llm_lens
    )
    local = np.stack(
        [llm_lens, batch["vit_lens"].numpy(), batch["num_units"].numpy(), img, targets], axis=1
    ).reshape(-1, 5)
    tables = gather_tables(local, process_group)
    units = gather_tables(batch["units_hw"].numpy().reshape(-1, 2), process_group)
    table = np.concatenate(tables).reshape(-1, 5)
    src = np.repeat(np.arange(world), [t.shape[0] for t in tables]).astype(np.int64)
    t1 = time.perf_counter()
    vit_cost, llm_cost = _phase_costs(table, units, policy)
    has_vit = table[:, _VIT] > 0
    patch_bytes = table[:, _VIT] * batch["patches"].shape[-1] * batch["patches"].element_size()
    vit_dest = np.full(src.size, -1, dtype=np.int64)
    vd, vmethod, vbefore, vplanned = _plan_phase(
        vit_cost[has_vit], src[has_vit], vision_ranks, topology, policy, patch_bytes[has_vit]
    )
    vit_dest[has_vit] = vd
    traffic = None
    if policy.embedding_bytes:  # the LLM placement also weighs the embeddings' trip
        own = table[:, _LLM] * _TOKEN_BYTES
        traffic = (own, (vit_dest, table[:, _IMG] * policy.embedding_bytes))
    llm_dest, lmethod, lbefore, lplanned = _plan_phase(
        llm_cost,
        src,
        llm_ranks,
        topology,
        policy,
        table[:, _LLM].astype(np.float64),
        cap=policy.llm_memory_cap,
        traffic=traffic,
    )
    pair = dict(zip(llm_ranks, label_ranks, strict=True))
    label_dest = np.array([pair[int(r)] for r in llm_dest], dtype=np.int64)
    route = Route(rank, world, process_group, topology, table, src, vit_dest, llm_dest, label_dest)
    route.methods = {"vision": vmethod, "llm": lmethod}
    route.loads = {
        "vision_before": vbefore,
        "vision_after": np.bincount(
            _phase_index(vd, vision_ranks), weights=vit_cost[has_vit], minlength=len(vision_ranks)
        ),
        "llm_before": lbefore,
        "llm_after": np.bincount(
            _phase_index(llm_dest, llm_ranks), weights=llm_cost, minlength=len(llm_ranks)
        ),
        # what the plan gives (the same as after, but under dry_run: what it would have given)
        "vision_planned": vplanned,
        "llm_planned": lplanned,
    }
    route.seconds["gather"] = t1 - t0
    route.seconds["plan"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    patches = route.move(
        batch["patches"],
        table[:, _VIT],
        np.where(has_vit, src, -1),
        vit_dest,
        "patches",
        stay=True,  # the encoder runs on the collective's device: no trip back to the host
    )
    unit_rows = table[:, _UNITS]
    units_hw = route.move(batch["units_hw"].reshape(-1, 2), unit_rows, src, vit_dest, "units")
    tokens = torch.stack([batch["input_ids"], batch["position_ids"], labels], dim=1)
    moved = route.move(tokens, table[:, _LLM], src, llm_dest, "tokens")
    if np.array_equal(label_dest, llm_dest):
        lab = moved[:, 2]
    else:
        lab = route.move(labels.reshape(-1, 1), table[:, _LLM], src, label_dest, "labels")[:, 0]
    route.seconds["exchange"] = time.perf_counter() - t2
    llm_index, label_index = route.llm_samples(), route.label_samples()
    out = LocalBatch(
        vision_index=route.vision_samples(),
        patches=patches,
        units_hw=units_hw,
        llm_index=llm_index,
        input_ids=moved[:, 0],
        position_ids=moved[:, 1],
        cu_seqlens=torch.from_numpy(_cu(table[llm_index, _LLM])).to(torch.int32),
        label_index=label_index,
        labels=lab,
        label_cu_seqlens=torch.from_numpy(_cu(table[label_index, _LLM])).to(torch.int32),
        image_token_id=int(batch["image_token_id"]),
    )
    return out, route
