"""Runtime DP redistribution (OrchMLLM §5–6): even out the samples of all ranks, per phase.

``redistribute`` runs on every rank of a process group with the rank's collated batch
(:class:`shards.Collator` output):

1. all_gather the per-sample lengths only (LLM tokens, encoder patches, tiles and their grids,
   image tokens, target tokens) — never the payload;
2. on every rank, the same plan per phase with ``balancing``'s runtime kernels
   (:mod:`trainer_adapter.phase_plan`): the vision plan over each sample's encoder cost for the
   ``vision_ranks``, a plan of its own for each further encoder phase (an audio encoder's,
   :mod:`trainer_adapter.encoder_phases`: its own cost, chunked or padded), the LLM plan over
   its LLM cost for the ``llm_ranks`` (identical input gives an identical plan, so nothing
   else is agreed on);
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

from balancing import CostModel
from balancing.post_balance import RUNTIME_METHODS
from equishard.common.values import check_count, check_flag, check_real
from trainer_adapter.encoder_phases import VISION, EncoderPhase
from trainer_adapter.exchange import gather_tables
from trainer_adapter.phase_plan import phase_index as _phase_index
from trainer_adapter.phase_plan import plan_phase as _plan_phase
from trainer_adapter.route import (
    _IMG,
    _LLM,
    _TOKEN_BYTES,
    _UNITS,
    _VIT,
    EncoderBatch,
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
    _, sq, _ = VISION.features(np.concatenate(units), table[:, _UNITS])
    cm = policy.cost_model
    return cm.vision.of(vit, sq, table[:, _UNITS]), cm.llm.of(llm, llm * llm, 1.0)


def _per_sample_tokens(batch: dict, key: str, cu: np.ndarray, n: int) -> np.ndarray:
    """Per sample, how many of its tokens are ``batch[key]`` (the slots an encoder fills)."""
    if not n:
        return np.zeros(0, dtype=np.int64)
    return np.add.reduceat((batch["input_ids"] == int(batch[key])).numpy(), cu[:-1])


def _extra_columns(batch, phases, cu, n) -> np.ndarray:
    """Per sample and phase beyond vision: its payload rows, its units, its output tokens."""
    cols = []
    for ph in phases:
        for key in (ph.rows, ph.count, ph.payload, ph.units, ph.token):
            if key not in batch:
                raise KeyError(
                    f"the batch has no {key!r}, which the {ph.name} phase reads (keys: "
                    f"{', '.join(sorted(batch))})"
                )
        cols += [
            batch[ph.rows].numpy().astype(np.int64).reshape(-1),
            batch[ph.count].numpy().astype(np.int64).reshape(-1),
            _per_sample_tokens(batch, ph.token, cu, n),
        ]
    return np.stack(cols, axis=1).reshape(n, len(cols)) if cols else np.zeros((n, 0), np.int64)


def _plan_extra(route, batch, phases, units, src, ranks, topology, policy):
    """Plan each phase beyond vision over the encoder ranks (its own cost and node-wise
    placement); record it on ``route``; returns each phase's (outputs' source rank, tokens)
    for the LLM placement."""
    trips = []
    for j, ph in enumerate(phases):
        rows, count, tokens = (5 + 3 * j + k for k in range(3))
        t = route.table
        tok, sq, n = ph.features(units[j], t[:, count])
        cost = policy.cost_model.phase(ph.cost).of(tok, sq, n) if policy.cost == "modeled" else tok
        has = t[:, rows] > 0
        payload = batch[ph.payload]
        row_bytes = int(np.prod(payload.shape[1:], dtype=np.int64)) * payload.element_size()
        dest = np.full(src.size, -1, dtype=np.int64)
        d, method, before, planned = _plan_phase(
            cost[has], src[has], ranks, topology, policy, (t[:, rows] * row_bytes)[has]
        )
        dest[has] = d
        route.encoders[ph.name] = (dest, rows, count, tokens)
        route.methods[ph.name] = method
        after = np.bincount(_phase_index(d, ranks), weights=cost[has], minlength=len(ranks))
        route.loads.update(
            {f"{ph.name}_before": before, f"{ph.name}_after": after, f"{ph.name}_planned": planned}
        )
        trips.append((dest, t[:, tokens] * policy.embedding_bytes))
    return trips


def _move_extra(route, batch, phases, src) -> dict:
    """Each phase beyond vision's payload and units to its encoder ranks."""
    out = {}
    for ph in phases:
        dest, rows, count, _ = route.encoders[ph.name]
        at = np.where(route.table[:, rows] > 0, src, -1)
        payload = route.move(batch[ph.payload], route.table[:, rows], at, dest, ph.name, stay=True)
        units = batch[ph.units].reshape(-1, ph.width)
        units = route.move(units, route.table[:, count], src, dest, f"{ph.name}_units")
        out[ph.name] = EncoderBatch(
            index=route.encoder_samples(ph.name),
            payload=payload,
            units=units,
            token_id=int(batch[ph.token]),
        )
    return out


def redistribute(
    batch: dict,
    process_group: dist.ProcessGroup | None,
    topology: Topology,
    policy: RedistributePolicy,
    phases: tuple[EncoderPhase, ...] = (),
) -> tuple[LocalBatch, Route]:
    """Balance the batches of all ranks; see the module docstring. Call on every rank.
    ``phases``: encoder phases beyond the vision tower (:func:`~trainer_adapter.
    encoder_phases.audio_phase`), each planned over the encoder ranks with its own cost; its
    share in ``LocalBatch.encoders``, its outputs sent with :meth:`Route.send_embeddings`."""
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
    local = np.hstack([local, _extra_columns(batch, phases, cu, llm_lens.size)])
    width = local.shape[1]
    tables = gather_tables(local, process_group)
    units = gather_tables(batch["units_hw"].numpy().reshape(-1, 2), process_group)
    extra_units = [
        np.concatenate(gather_tables(batch[ph.units].numpy().reshape(-1, ph.width), process_group))
        for ph in phases
    ]
    table = np.concatenate(tables).reshape(-1, width)
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
    route = Route(rank, world, process_group, topology, table, src, vit_dest, vit_dest, vit_dest)
    trips = _plan_extra(route, batch, phases, extra_units, src, vision_ranks, topology, policy)
    traffic = None
    if policy.embedding_bytes:  # the LLM placement also weighs the embeddings' trips
        own = table[:, _LLM] * _TOKEN_BYTES
        traffic = (own, [(vit_dest, table[:, _IMG] * policy.embedding_bytes), *trips])
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
    route.llm_dest, route.label_dest = llm_dest, label_dest
    route.methods.update({"vision": vmethod, "llm": lmethod})
    route.loads.update(
        {
            "vision_before": vbefore,
            "vision_after": np.bincount(
                _phase_index(vd, vision_ranks),
                weights=vit_cost[has_vit],
                minlength=len(vision_ranks),
            ),
            "llm_before": lbefore,
            "llm_after": np.bincount(
                _phase_index(llm_dest, llm_ranks), weights=llm_cost, minlength=len(llm_ranks)
            ),
            # what the plan gives (the same as after, but under dry_run: what it would have given)
            "vision_planned": vplanned,
            "llm_planned": lplanned,
        }
    )
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
    encoders = _move_extra(route, batch, phases, src)
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
        encoders=encoders,
    )
    return out, route
