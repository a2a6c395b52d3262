"""The balanced forward for the decoder of a Hugging Face VLM (see
:mod:`trainer_adapter.hf.balance`).

:func:`balance_decoder` — around the language model (``model.model.language_model``;
``text_model`` in Idefics3 / SmolVLM). Its input is this rank's samples packed in one row
(batch size 1, no attention mask, position ids restarting at 0 per sample: HF's packed
convention; Qwen's ``[4, 1, L]`` positions, text row first, included; Qwen3-VL's deepstack
features and visual-token mask travel with their samples; the 4-D masks a model builds itself,
like Gemma 3's, move as per-sample blocks: :mod:`trainer_adapter.hf.masks`; per-token inputs,
like ERNIE's expert routing or Gemma 4's per-layer inputs, move with their tokens); whole
samples are spread by LLM cost (``alpha*L + beta*L^2``), the decoder runs on the received pack
and the hidden states come back to their samples' own rank, where the LM head and loss run as
without balancing.

A rank's own row is checked before the mask agreement and a refusal rides on it; the decoder
failing on what a rank received rides on the output agreement: every rank raises
(:mod:`trainer_adapter.group_errors`).
"""

from __future__ import annotations

import dataclasses
import inspect
import types

import numpy as np
import torch
import torch.distributed as dist

from balancing import CostModel
from trainer_adapter.group_errors import raise_together, reason_of
from trainer_adapter.hf.decoder_row import Row, agreed_per_token, read_row, refuse_crossing
from trainer_adapter.hf.masks import (
    agree_masks,
    route_masks,
)
from trainer_adapter.hf.packing import (
    check_recurrent,
    move_per_token,
    packing_kwargs,
)
from trainer_adapter.hf.rounds import length_cost, settle_in_order
from trainer_adapter.item_exchange import agreed_settings, plan_items
from trainer_adapter.item_outputs import (
    output_agree,
    output_anchor,
    output_route_back,
    output_signature,
    run_received,
    runs_everywhere,
)
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = ["balance_decoder"]


def _output_class(forward) -> type:
    """The output class a decoder's ``forward`` is annotated to return (an MoE decoder's
    ``MoeModelOutputWithPast``, whose ``router_logits`` its model reads), for the output of an
    empty row that never reaches it; ``BaseModelOutputWithPast`` where none is named."""
    import typing

    from transformers.modeling_outputs import BaseModelOutputWithPast
    from transformers.utils import ModelOutput

    ann = inspect.signature(forward).return_annotation
    for c in (ann, *typing.get_args(ann)):
        if isinstance(c, type) and issubclass(c, ModelOutput):
            return c
    return BaseModelOutputWithPast


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Setup:
    """What :func:`balance_decoder` installed, as every step's forward reads it."""

    inner: object  # the decoder's own forward
    towers: list  # groups of towers, in the order the model calls them
    policy: RedistributePolicy
    llm: object  # the LLM phase's cost model
    cache_key: str  # the KV cache's keyword (``cache`` from transformers 5.24)
    group: dist.ProcessGroup | None
    topology: Topology | None


def _plain(self, s: _Setup, input_ids, attention_mask, position_ids, inputs_embeds, kw, zero):
    """The decoder unbalanced (an empty rank's row never reaches it)."""
    if inputs_embeds is None:
        inputs_embeds = self.get_input_embeddings()(input_ids)
    if inputs_embeds.shape[1] == 0:
        hidden = inputs_embeds * 0 + output_anchor(self)
        return _output_class(s.inner)(last_hidden_state=hidden if zero is None else hidden + zero)
    out = s.inner(
        attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds, **kw
    )
    if zero is not None:
        out.last_hidden_state = out.last_hidden_state + zero
    return out


def _send_deepstack(route, row: Row, x: torch.Tensor, kw: dict) -> torch.Tensor:
    """Qwen3-VL's visual-token mask and deepstack features to the samples' new ranks; ``x``
    tied to their exchange (every rank takes part in its backward)."""
    layers = int(route.table[:, 2].max()) if route.table.size else 0  # agreed by all ranks
    if not layers:
        return x
    embeds = row.inputs_embeds
    vmask = row.vmask
    if vmask is None:
        vmask = torch.zeros(embeds.shape[:2], dtype=torch.bool)
    # no features here: an empty block still tied to the graph, so that this rank takes part
    # in the reverse exchange in the backward like every other
    rows = row.deep or [embeds[0, :0]] * layers
    m = route.send(vmask.reshape(-1, 1).to(torch.int64), 0, "visual_pos_masks")
    d = route.send(torch.cat(list(rows), dim=1), 1, "deepstack")
    x = x + d.sum() * 0  # used or not below, its backward exchange runs on every rank
    if int(route.table[route.received, 1].sum()):
        kw["visual_pos_masks"] = m.reshape(1, -1).bool().to(embeds.device)
        kw["deepstack_visual_embeds"] = list(d.split(embeds.shape[-1], dim=1))
    return x


def _run_and_return(self, s: _Setup, route, x, p, moved_masks, kw, settings, zero, where):
    """The decoder on the received pack; its hidden states (and an MoE decoder's router
    logits) back to their samples' own ranks."""
    got, failure = run_received(
        route,
        lambda: s.inner(
            inputs_embeds=x[None], position_ids=p, attention_mask=moved_masks, **{**kw, **settings}
        ),
        self,
        "llm",
    )
    out, cls = None, None
    if got is not None:
        # per token: the hidden states, and an MoE decoder's router logits (each layer's
        # [tokens, experts], for the load-balancing loss its model computes on the home
        # rank over its own tokens, as without balancing)
        out = {"last_hidden_state": got.last_hidden_state[0]}
        if getattr(got, "router_logits", None) is not None:
            out["router_logits"] = tuple(got.router_logits)
        cls = type(got)
    total = int(route.table[route.received, 0].sum())
    sig = None if out is None else (output_signature(out, total), cls)
    tensor_sig, cls = output_agree(sig, s.group, failure=failure, where=where)
    anchor = output_anchor(self) + (x.sum() * 0 if out is None else 0)  # see balance_vision
    back = output_route_back(out, tensor_sig, route, route.table[:, 0], anchor)
    hidden = back["last_hidden_state"][None]
    extra = {k: v for k, v in back.items() if k != "last_hidden_state"}
    return cls(last_hidden_state=hidden if zero is None else hidden + zero, **extra)


def _balanced(
    self, s: _Setup, input_ids, attention_mask, position_ids, inputs_embeds, kw, zero, idle
):
    """One step's balanced forward: read the row, agree with every rank, send the samples,
    run, send the hidden states back. ``idle``: idle ranks run copies (FSDP2 per block)."""
    where = f"{type(self).__name__} (balance_decoder)"
    refusal, row = None, Row()  # see balance_vision
    try:
        row = read_row(self, input_ids, attention_mask, position_ids, inputs_embeds, kw, where)
    except Exception as e:  # every rank raises it: agree_masks
        refusal, row.masks = e, None
    reason = None if refusal is None else reason_of(refusal)
    masks, agreed = agree_masks(row.masks, s.group, (row.mine, reason, row.settings))
    raise_together([r for _, r, _ in agreed], where, refusal)
    settings = agreed_settings([st for _, _, st in agreed], where)
    agreed = [m for m, _, _ in agreed]
    spec = {k: v for sp, _, _ in agreed for k, v in sp.items()}
    refuse_crossing(sorted({k for _, names, _ in agreed for k in names}), where)
    per_token = agreed_per_token([tok for _, _, tok in agreed], where)
    check_recurrent(self, spec)  # the same on every rank: spec is agreed
    embeds, lengths = row.inputs_embeds, row.lengths
    row_bytes = embeds.shape[-1] * embeds.element_size()
    route = plan_items(
        row.table,
        length_cost(s.llm, s.policy),
        group=s.group,
        topology=s.topology,
        policy=s.policy,
        volume=lambda t: t[:, 0] * float(row_bytes),
        idle=idle,
        where=where,
        # an empty row's placeholders take these (Qwen3-VL's deepstack features come out of
        # the tower in bf16 under autocast, the embeddings they join stay in float32)
        dtypes={"embeddings": embeds.dtype, "deepstack": row.deep[0].dtype if row.deep else None},
    )
    self.last_route = route
    x = route.send(embeds[0], 0, "embeddings")
    lead = int(np.prod(position_ids.shape[:-1]))
    pos_rows = position_ids.reshape(lead, position_ids.shape[-1]).T  # [L, rows]
    p = route.send(pos_rows.contiguous(), 0, "positions").T
    p = p.reshape(*position_ids.shape[:-1], -1) if position_ids.ndim == 3 else p.reshape(1, -1)
    tie = embeds.sum() * 0  # in the graph on every rank, an empty one too
    for key, sp in sorted(per_token.items()):  # ERNIE's token types, Gemma 4's per-layer
        kw[key] = move_per_token(kw.pop(key, None), key, sp, int(lengths.sum()), route, tie)
    x = _send_deepstack(route, row, x, kw)
    moved_masks = None
    if masks is not None:
        moved_masks = route_masks(masks, lengths, route, s.group, embeds)
    kw = packing_kwargs(kw, spec, route.table[route.received, 0], x.device)
    return _run_and_return(self, s, route, x, p, moved_masks, kw, settings, zero, where)


def _forward(self, s: _Setup, input_ids, attention_mask, position_ids, inputs_embeds, **kw):
    """The installed forward: paused, plain or balanced."""
    if self.equishard_paused:  # see paused(): this rank's own forward, no collective
        return s.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kw,
        )
    # packed training: HF finds the sample boundaries from the positions only without a KV
    # cache (and a cache makes no sense for samples that moved)
    if kw.pop("past_key_values", None) is not None or kw.pop("cache", None) is not None:
        raise ValueError(
            "balance_decoder is for training and got a KV cache (past_key_values / cache: "
            "generation?): run generate() inside `with trainer_adapter.hf.balance.paused("
            "model):`, where each rank runs its own inputs with no exchange"
        )
    kw.update({"use_cache": False, s.cache_key: None})
    zero = None
    if s.towers:  # every rank through as many tower rounds as the busiest
        zero = settle_in_order(s.towers)
    args = (input_ids, attention_mask, position_ids, inputs_embeds, kw, zero)
    idle = runs_everywhere(self, s.policy)  # FSDP2 per block: idle ranks run copies
    if not s.policy.enabled and not idle:
        # the plain decoder; with idle ranks kept running (FSDP2 per block), the identity
        # plan of the balanced forward, which gives them copies
        return _plain(self, s, *args)
    return _balanced(self, s, *args, idle)


def balance_decoder(
    decoder: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
    cost_model: CostModel | None = None,
    vision: torch.nn.Module | list | None = None,
    encoders: list | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on an HF decoder (``forward(inputs_embeds=...,
    position_ids=...)``, e.g. Qwen2-VL's ``language_model``) fed one packed row per rank.
    ``vision``: a tower wrapped by :func:`balance_vision` (or a list of towers the model calls
    one after the other on the same images); on a step where this rank had no images (so the
    model never called it) the decoder joins the tower's exchange first. ``encoders``
    (instead of ``vision``): every balanced tower in the order the model calls them, each a
    tower or such a list (Qwen2.5-Omni: ``[audio_tower, visual]``); a tower's own round first
    settles those before it (:mod:`trainer_adapter.hf.rounds`)."""
    if vision is not None and encoders is not None:
        raise ValueError("give the towers as vision= or as encoders= (in call order), not both")
    if encoders is None:
        encoders = [] if vision is None else [vision]
    towers = [list(g) if isinstance(g, list | tuple) else [g] for g in encoders]
    for j, called in enumerate(towers):
        for tower in called:
            tower.equishard_before = towers[:j]
    policy = policy or RedistributePolicy()
    cfg = getattr(decoder, "config", None)
    calibrated = policy.cost_model.calibrated  # measured beats the decoder's dimensions
    if (
        cost_model is None
        and not calibrated
        and cfg is not None
        and getattr(cfg, "hidden_size", None)
    ):
        cost_model = CostModel.from_dims(
            vit_hidden=1, vit_layers=1, llm_hidden=cfg.hidden_size, llm_layers=cfg.num_hidden_layers
        )
    inner = decoder.forward
    setup = _Setup(
        inner=inner,
        towers=towers,
        policy=policy,
        llm=(cost_model or policy.cost_model).llm,
        # the KV cache's keyword: ``cache`` from transformers 5.24, ``past_key_values`` before
        cache_key="cache" if "cache" in inspect.signature(inner).parameters else "past_key_values",
        group=group,
        topology=topology,
    )

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kw
    ):
        return _forward(self, setup, input_ids, attention_mask, position_ids, inputs_embeds, **kw)

    decoder.equishard_paused = False
    decoder.forward = types.MethodType(forward, decoder)
    return decoder
