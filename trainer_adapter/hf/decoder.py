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

import inspect
import types

import numpy as np
import torch
import torch.distributed as dist

from balancing import CostModel
from trainer_adapter.group_errors import raise_together, reason_of
from trainer_adapter.hf.masks import (
    agree_masks,
    bidirectional_without_masks,
    crossing_masks,
    route_masks,
    split_masks,
)
from trainer_adapter.hf.packing import (
    call_settings,
    check_decoder_inputs,
    check_recurrent,
    move_per_token,
    packing_kwargs,
    packing_spec,
    per_token_spec,
)
from trainer_adapter.hf.rounds import length_cost, settle_together
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


def _sample_lengths(text_positions: torch.Tensor) -> np.ndarray:
    """Lengths of the packed samples: a new sample starts where the text position is 0."""
    pos = text_positions.reshape(-1).detach().cpu().numpy()
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(pos == 0)
    if starts.size == 0 or starts[0] != 0:
        raise ValueError(
            "balance_decoder needs packed samples whose position ids restart at 0 per sample "
            "(HF's packed convention); the first position is not 0"
        )
    return np.diff(np.append(starts, pos.size)).astype(np.int64)


_PACK_IT = (
    "Give the model this rank's samples concatenated in one row, position_ids restarting at 0 "
    "per sample and no attention mask: pack a padded batch first (trainer_adapter.HFPacker, "
    "or transformers' DataCollatorWithFlattening, makes such rows)"
)


def _packed_row(inputs_embeds, attention_mask, position_ids):
    """Check that this rank's decoder input is one packed row (batch size 1, no padding, HF's
    position ids restarting per sample; Qwen's ``[4, 1, L]`` with the text row first); returns
    (the 2-D attention mask or None, the model's 4-D masks by name or None, sample lengths)."""
    if inputs_embeds.shape[0] != 1 or position_ids is None:
        raise ValueError(
            "balance_decoder needs one packed row per rank (batch size 1) with position ids "
            f"restarting per sample; got inputs of shape {tuple(inputs_embeds.shape)} and "
            f"position_ids {None if position_ids is None else tuple(position_ids.shape)}. "
            + _PACK_IT
        )
    # a model that builds its own 4-D masks (Gemma 3) passes them: they move with the samples
    attention_mask, masks = split_masks(attention_mask)
    if attention_mask is not None and not bool(attention_mask.all()):
        pads = int((attention_mask == 0).sum())
        raise ValueError(
            f"balance_decoder takes packed rows without padding; the attention_mask marks "
            f"{pads} of {attention_mask.shape[-1]} tokens as padding. " + _PACK_IT
        )
    if position_ids.ndim == 3 and position_ids.shape[0] != 4:
        raise ValueError(
            "balance_decoder: 3-D position ids must be [4, 1, L] with the text positions "
            f"first (Qwen's convention; they mark where samples start), got "
            f"{tuple(position_ids.shape)}"
        )
    if position_ids.shape[-1] != inputs_embeds.shape[1]:
        raise ValueError(
            f"balance_decoder: position_ids {tuple(position_ids.shape)} do not cover the row "
            f"of {inputs_embeds.shape[1]} tokens"
        )
    text = position_ids[0] if position_ids.ndim == 3 else position_ids
    return attention_mask, masks, _sample_lengths(text)


def _sample_table(lengths: np.ndarray, vmask, deep, where: str) -> np.ndarray:
    """The decoder's item table: per sample its length, its visual tokens (Qwen3-VL's
    ``visual_pos_masks``) and the deepstack layers (each ``[visual tokens, D]``)."""
    visual = np.zeros_like(lengths)
    if vmask is not None:
        marks = vmask.reshape(-1).detach().cpu().numpy().astype(np.int64)
        if marks.size != lengths.sum():
            raise ValueError(
                f"{where}: visual_pos_masks {tuple(vmask.shape)} does not cover the row of "
                f"{int(lengths.sum())} tokens"
            )
        visual = np.add.reduceat(marks, np.cumsum(lengths) - lengths) if lengths.size else visual
    layers = len(deep) if deep is not None else 0
    if deep is not None and any(len(d) != visual.sum() for d in deep):
        raise ValueError(
            f"{where}: deepstack_visual_embeds have {[len(d) for d in deep]} rows, "
            f"visual_pos_masks marks {int(visual.sum())} visual tokens"
        )
    return np.column_stack([lengths, visual, np.full_like(lengths, layers)]).reshape(-1, 3)


def _agreed_per_token(specs: list[dict], where: str) -> dict:
    """The per-token inputs of all ranks by name (dtype, per-token shape); ranks that give one
    differently (another dtype or shape) are refused on every rank."""
    out: dict = {}
    for sp in specs:
        for key, value in sp.items():
            if out.setdefault(key, value) != value:
                raise ValueError(
                    f"{where}: ranks give `{key}` as {out[key]} and as {value} (dtype, "
                    "per-token shape); every rank must give it alike"
                )
    return out


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


def balance_decoder(
    decoder: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
    cost_model: CostModel | None = None,
    vision: torch.nn.Module | list | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on an HF decoder (``forward(inputs_embeds=...,
    position_ids=...)``, e.g. Qwen2-VL's ``language_model``) fed one packed row per rank.
    ``vision``: a tower wrapped by :func:`balance_vision` (or a list of towers the model calls
    one after the other on the same images); on a step where this rank had no images (so the
    model never called it) the decoder joins the tower's exchange first."""
    towers = [] if vision is None else list(vision) if isinstance(vision, list) else [vision]
    policy = policy or RedistributePolicy()
    cfg = getattr(decoder, "config", None)
    if cost_model is None and cfg is not None and getattr(cfg, "hidden_size", None):
        cost_model = CostModel.from_dims(
            vit_hidden=1, vit_layers=1, llm_hidden=cfg.hidden_size, llm_layers=cfg.num_hidden_layers
        )
    llm = (cost_model or policy.cost_model).llm
    inner = decoder.forward
    # the KV cache's keyword: ``cache`` from transformers 5.24, ``past_key_values`` before
    cache_key = "cache" if "cache" in inspect.signature(inner).parameters else "past_key_values"

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kw
    ):
        if self.equishard_paused:  # see paused(): this rank's own forward, no collective
            return inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                **kw,
            )
        # packed training: HF finds the sample boundaries from the positions only without a
        # KV cache (and a cache makes no sense for samples that moved)
        if kw.pop("past_key_values", None) is not None or kw.pop("cache", None) is not None:
            raise ValueError(
                "balance_decoder is for training and got a KV cache (past_key_values / cache: "
                "generation?): run generate() inside `with trainer_adapter.hf.balance.paused("
                "model):`, where each rank runs its own inputs with no exchange"
            )
        kw.update({"use_cache": False, cache_key: None})
        zero = None
        if towers:  # every rank through as many tower rounds as the busiest
            zero = settle_together(towers)
        idle = runs_everywhere(self, policy)  # FSDP2 per block: idle ranks run copies
        if not policy.enabled and not idle:
            # the plain decoder (an empty rank's row never reaches it); with idle ranks kept
            # running (FSDP2 per block), the identity plan below, which gives them copies
            if inputs_embeds is None:
                inputs_embeds = self.get_input_embeddings()(input_ids)
            if inputs_embeds.shape[1] == 0:
                hidden = inputs_embeds * 0 + output_anchor(self)
                return _output_class(inner)(
                    last_hidden_state=hidden if zero is None else hidden + zero
                )
            out = inner(
                attention_mask=attention_mask,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                **kw,
            )
            if zero is not None:
                out.last_hidden_state = out.last_hidden_state + zero
            return out
        where = f"{type(self).__name__} (balance_decoder)"
        refusal, mine, masks, settings = None, None, None, None  # see balance_vision
        try:
            if inputs_embeds is None:
                inputs_embeds = self.get_input_embeddings()(input_ids)
            attention_mask, masks, lengths = _packed_row(
                inputs_embeds, attention_mask, position_ids
            )
            # the head computes the loss on the home rank; a decoder without a head does not
            # read the labels some models hand it (Gemma 4), so they stay home
            kw.pop("labels", None)
            check_decoder_inputs(self, kw, lengths)  # nothing per-sample left behind
            # Qwen3-VL's deepstack: per visual token, features added in the first decoder
            # layers; they travel with their samples (table: length, visual tokens, layers)
            vmask = kw.pop("visual_pos_masks", None)
            deep = kw.pop("deepstack_visual_embeds", None)
            table = _sample_table(lengths, vmask, deep, where)
            # the masks that join samples, the packing kwargs, the per-token inputs (their
            # dtypes and per-token shapes): agreed in one collective with the refusals
            joins = crossing_masks(masks, lengths) + bidirectional_without_masks(self, masks)
            mine = (packing_spec(kw), joins, per_token_spec(kw))
            settings = call_settings(kw) if lengths.size else None  # see plan_items
        except Exception as e:  # every rank raises it: agree_masks
            refusal, masks = e, None
        reason = None if refusal is None else reason_of(refusal)
        masks, agreed = agree_masks(masks, group, (mine, reason, settings))
        raise_together([r for _, r, _ in agreed], where, refusal)
        settings = agreed_settings([st for _, _, st in agreed], where)
        agreed = [m for m, _, _ in agreed]
        spec = {k: v for sp, _, _ in agreed for k, v in sp.items()}
        crossing = sorted({k for _, names, _ in agreed for k in names})
        per_token = _agreed_per_token([tok for _, _, tok in agreed], where)
        if crossing:  # every rank refuses, also one whose row holds a single sample
            raise ValueError(
                f"{where}: the model's {', '.join(crossing)} "
                "lets the samples of a packed row attend to each other (PaliGemma's prefix "
                "block, token_type_ids == 0, spans every sample's image and prompt; a "
                "bidirectional decoder given no mask sees the whole row), so moving samples "
                "would change what they see; HF's packed rows already mix them without "
                "balancing. Balance the vision tower only (balance_model(..., llm=False)), or "
                "give the decoder masks that keep each sample to itself"
            )
        check_recurrent(self, spec)  # the same on every rank: spec is agreed
        row_bytes = inputs_embeds.shape[-1] * inputs_embeds.element_size()
        route = plan_items(
            table,
            length_cost(llm, policy),
            group=group,
            topology=topology,
            policy=policy,
            volume=lambda t: t[:, 0] * float(row_bytes),
            idle=idle,
            where=where,
            # an empty row's placeholders take these (Qwen3-VL's deepstack features come out of
            # the tower in bf16 under autocast, the embeddings they join stay in float32)
            dtypes={
                "embeddings": inputs_embeds.dtype,
                "deepstack": deep[0].dtype if deep else None,
            },
        )
        self.last_route = route
        x = route.send(inputs_embeds[0], 0, "embeddings")
        lead = int(np.prod(position_ids.shape[:-1]))
        pos_rows = position_ids.reshape(lead, position_ids.shape[-1]).T  # [L, rows]
        p = route.send(pos_rows.contiguous(), 0, "positions").T
        p = p.reshape(*position_ids.shape[:-1], -1) if position_ids.ndim == 3 else p.reshape(1, -1)
        tie = inputs_embeds.sum() * 0  # in the graph on every rank, an empty one too
        for key, sp in sorted(per_token.items()):  # ERNIE's token types, Gemma 4's per-layer
            kw[key] = move_per_token(kw.pop(key, None), key, sp, int(lengths.sum()), route, tie)
        layers = int(route.table[:, 2].max()) if route.table.size else 0  # agreed by all ranks
        if layers:
            width = inputs_embeds.shape[-1]
            if vmask is None:
                vmask = torch.zeros(inputs_embeds.shape[:2], dtype=torch.bool)
            # no features here: an empty block still tied to the graph, so that this rank takes
            # part in the reverse exchange in the backward like every other
            rows = deep or [inputs_embeds[0, :0]] * layers
            m = route.send(vmask.reshape(-1, 1).to(torch.int64), 0, "visual_pos_masks")
            d = route.send(torch.cat(list(rows), dim=1), 1, "deepstack")
            x = x + d.sum() * 0  # used or not below, its backward exchange runs on every rank
            if int(route.table[route.received, 1].sum()):
                kw["visual_pos_masks"] = m.reshape(1, -1).bool().to(inputs_embeds.device)
                kw["deepstack_visual_embeds"] = list(d.split(width, dim=1))
        moved_masks = None
        if masks is not None:
            moved_masks = route_masks(masks, lengths, route, group, inputs_embeds)
        kw = packing_kwargs(kw, spec, route.table[route.received, 0], x.device)
        got, failure = run_received(
            route,
            lambda: inner(
                inputs_embeds=x[None],
                position_ids=p,
                attention_mask=moved_masks,
                **{**kw, **settings},
            ),
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
        tensor_sig, cls = output_agree(sig, group, failure=failure, where=where)
        anchor = output_anchor(self) + (x.sum() * 0 if out is None else 0)  # see balance_vision
        back = output_route_back(out, tensor_sig, route, route.table[:, 0], anchor)
        hidden = back["last_hidden_state"][None]
        extra = {k: v for k, v in back.items() if k != "last_hidden_state"}
        return cls(last_hidden_state=hidden if zero is None else hidden + zero, **extra)

    decoder.equishard_paused = False
    decoder.forward = types.MethodType(forward, decoder)
    return decoder
