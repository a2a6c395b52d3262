"""Runtime balancing inside Hugging Face vision-language models, in the user's own loop.

Wrappers install a balanced ``forward`` on a module of the model (parameter names, state
dicts and checkpoints are unchanged); both are collectives over the DP group, so every rank
must run every step's forward and backward:

* :func:`balance_vision` — around the vision tower (``model.model.visual`` of Qwen2-VL /
  Qwen2.5-VL). Its forward takes this rank's images (packed patches + ``grid_thw``), spreads
  them over the group by modeled encoder cost (``alpha*patches + beta*patches^2`` per image,
  coefficients from the tower's size), runs the tower on what this rank received and returns
  the outputs of this rank's own images in their original order. Every per-image output (the
  merged embeddings, the per-patch states, deepstack feature lists) travels back; gradients
  take the reverse way. Each call is one exchange round: a model calls its tower once per
  modality it has (images, then videos), and ranks without one join as many rounds as the
  busiest rank makes, before the decoder's exchange (``equishard_settle``).
* :func:`balance_tiles` — the same around tile towers (InternVL's, LLaVA's CLIP, the SigLIP of
  LLaVA-OneVision; Idefics3's / SmolVLM's with each tile's patch mask).
* :func:`balance_decoder` — around the language model (``model.model.language_model``;
  ``text_model`` in Idefics3 / SmolVLM). Its input is this rank's samples packed in one row
  (batch size 1, no attention mask, position ids restarting at 0 per sample: HF's packed
  convention; Qwen's ``[4, 1, L]`` positions, text row first, included; Qwen3-VL's deepstack
  features and visual-token mask travel with their samples; the 4-D masks a model builds
  itself, like Gemma 3's, move as per-sample blocks: :mod:`trainer_adapter.hf_masks`); whole
  samples are spread by LLM cost (``alpha*L + beta*L^2``), the decoder runs on the received
  pack and the hidden states come back to their samples' own rank, where the LM head and loss
  run as without balancing.

For gradients identical to a single process over the global batch, normalize the loss by the
global number of target tokens: ``num_items_in_batch=global_targets(labels, group)``. Inside
``with paused(model):`` the wrapped modules run each rank's own inputs with no exchange
(``generate``, a rank that evaluates alone).
:func:`balance_model` installs the right ones on a ``transformers`` VLM.
"""

from __future__ import annotations

import contextlib
import inspect
import types

import numpy as np
import torch
import torch.distributed as dist

from balancing import CostModel
from trainer_adapter.exchange import collective_device
from trainer_adapter.group_errors import raise_together, reason_of
from trainer_adapter.hf_masks import agree_masks, crossing_masks, route_masks, split_masks
from trainer_adapter.hf_naflex import balance_naflex
from trainer_adapter.hf_packing import (
    PACKING_KEYS,
    check_decoder_inputs,
    check_item_inputs,
    check_recurrent,
    move_per_token,
    packing_kwargs,
    packing_spec,
    per_token_spec,
)
from trainer_adapter.hf_patch_positions import balance_patch_positions
from trainer_adapter.hf_pixtral import balance_pixtral
from trainer_adapter.hf_rounds import install, joined, length_cost, record, tower_cost
from trainer_adapter.item_exchange import plan_items
from trainer_adapter.item_outputs import (
    output_agree,
    output_anchor,
    output_route_back,
    output_signature,
    route_home,
    run_received,
)
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = [
    "balance_decoder",
    "balance_model",
    "balance_tiles",
    "balance_vision",
    "global_targets",
    "paused",
]


def global_targets(labels: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Target tokens of all ranks (labels != -100 after the shift HF's causal-LM loss makes)."""
    n = (labels[..., 1:] != -100).sum().to(torch.int64).reshape(1)
    n = n.to(collective_device(group))
    dist.all_reduce(n, group=group)
    return n[0]


@contextlib.contextmanager
def paused(model: torch.nn.Module):
    """Inside the block the model's balanced modules run as without equishard: each rank its
    own inputs, no exchange, no collective, so ranks may call the model differently (``generate``
    with a KV cache, evaluation on one rank only). On exit balancing is back as before."""
    mods = [m for m in model.modules() if hasattr(m, "equishard_paused")]
    if not mods:
        raise ValueError(
            f"{type(model).__name__} has no balanced modules: call balance_model(model) first"
        )
    before = [m.equishard_paused for m in mods]
    for m in mods:
        m.equishard_paused = True
    try:
        yield model
    finally:
        for m, was in zip(mods, before, strict=True):
            m.equishard_paused = was


# ------------------------------------------------------------------------------ vision
def balance_vision(
    tower: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on a Qwen-style vision tower (``forward(pixel_values,
    grid_thw)``; one row of ``pixel_values`` per patch). Returns the tower; ``tower.last_route``
    holds the latest plan (loads before/after, bytes moved)."""
    policy = policy or RedistributePolicy()
    model = tower_cost(tower, policy).vision
    inner = tower.forward
    width = _patch_width(tower)  # a rank without images joins with [0, width]

    def forward(self, hidden_states, grid_thw=None, **kwargs):
        if not self.equishard_joining and _none(grid_thw) and _none(hidden_states):
            return inner(hidden_states, grid_thw=grid_thw, **kwargs)  # no round: see hf_rounds
        where = f"{type(self).__name__} (balance_vision)"
        refusal = None  # this rank's, raised on every rank by plan_items (group_errors)
        try:
            if policy.enabled:  # the text's packing kwargs may pass through; nothing else
                check_item_inputs(where, (), kwargs, PACKING_KEYS)
            table = _grid_table(hidden_states, grid_thw, where)
            row_bytes = hidden_states[0].numel() * hidden_states.element_size() if len(table) else 0
        except Exception as e:  # every rank raises it: plan_items
            table, row_bytes, refusal = None, 0, e
        route = plan_items(
            table,
            length_cost(model, policy),
            group=group,
            topology=topology,
            policy=policy,
            volume=lambda t: t[:, 0] * float(row_bytes),
            refusal=refusal,
            where=where,
        )
        record(self, route)
        if route.src.size == 0:  # no images anywhere this step: nothing to exchange
            if self.equishard_joining:
                return None
            return inner(hidden_states, grid_thw=grid_thw, **kwargs)
        x = route.send(hidden_states, 0, "patches")
        g = route.send(grid_thw.reshape(-1, 3).to(torch.int64), np.ones_like(route.src), "grid")
        g = g.to(device=grid_thw.device, dtype=grid_thw.dtype)
        out, failure = run_received(route, lambda: inner(x, grid_thw=g, **kwargs))
        own = not self.equishard_joining
        return route_home(self, out, x, route, group, own_call=own, failure=failure)

    def join(self) -> torch.Tensor:
        """Take part in this step's exchange with no images of this rank's own (HF skips the
        tower when ``pixel_values`` is None); returns a zero that the caller adds to its output
        so the reverse exchange runs in the backward too."""
        empty = next(self.parameters()).new_zeros((0, width))
        return joined(self, empty, grid_thw=torch.zeros(0, 3, dtype=torch.int64))

    return install(tower, forward, join)


def _none(x) -> bool:
    return x is None or x.numel() == 0


def _grid_table(hidden_states, grid_thw, where: str) -> np.ndarray:
    """The item table of a Qwen-style tower's images: (patch rows, t, h, w) per image; the
    rows must be the patches the grids give."""
    if grid_thw is None:
        raise ValueError(f"{where} was given {len(hidden_states)} patch rows but no grid_thw")
    grid = grid_thw.detach().to("cpu", torch.int64).reshape(-1, 3).numpy()
    rows = grid.prod(axis=1)
    if len(hidden_states) != rows.sum():
        raise ValueError(
            f"{where} was given {len(hidden_states)} patch rows, its grid_thw "
            f"{grid.tolist()[:6]}{'...' if len(grid) > 6 else ''} make {int(rows.sum())}: "
            "pixel_values and image_grid_thw must come from the same images"
        )
    return np.column_stack([rows, grid]).reshape(-1, 4)


def _patch_width(tower: torch.nn.Module) -> int:
    """The width of one row of a Qwen-style tower's flattened patches: what its patch
    embedding takes (Qwen's Conv3d: channels x frames x patch^2; ERNIE's Linear: its inputs)."""
    embed = getattr(tower, "patch_embed", None)
    for m in embed.modules() if isinstance(embed, torch.nn.Module) else ():
        if isinstance(m, torch.nn.Linear):
            return int(m.in_features)
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            return int(m.in_channels * np.prod(m.kernel_size))
    raise ValueError(
        f"{type(tower).__name__} takes grid_thw but has no Qwen-style patch_embed (a Linear or "
        "Conv layer taking one row of flattened patches), so balance_vision cannot move its "
        "inputs; balance the decoder only (balance_model(..., encoder=False))"
    )


def _empty_pixels(tower: torch.nn.Module) -> torch.Tensor:
    cfg = tower.config
    size = cfg.image_size if isinstance(cfg.image_size, list | tuple) else (cfg.image_size,) * 2
    ref = next(tower.parameters())
    return ref.new_zeros((0, getattr(cfg, "num_channels", 3), *size))


def balance_tiles(
    tower: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on a tile-style vision tower (InternVL's, LLaVA's CLIP /
    SigLIP, Idefics3's / SmolVLM's: ``forward(pixel_values)`` with one ``[C, H, W]`` tile per
    row, every tile the same encoder cost). Tiles are spread evenly over the group; a tower that
    takes a ``patch_attention_mask`` (Idefics3, SmolVLM: the patches of a tile that are image,
    not padding) gets each tile's mask with it. Every per-tile output (last hidden state, pooled
    output, the hidden states of every layer) comes back in the original order."""
    policy = policy or RedistributePolicy()
    inner = tower.forward
    masked = "patch_attention_mask" in inspect.signature(inner).parameters

    def forward(self, pixel_values=None, *args, **kwargs):
        if not self.equishard_joining and (pixel_values is None or len(pixel_values) == 0):
            return inner(pixel_values, *args, **kwargs)  # no round: see hf_rounds
        where = f"{type(self).__name__} (balance_tiles)"
        refusal = None  # see balance_vision
        try:
            if policy.enabled:
                moved = ("patch_attention_mask", *PACKING_KEYS) if masked else PACKING_KEYS
                check_item_inputs(where, args, kwargs, moved)
            n = int(pixel_values.shape[0])
            row_bytes = pixel_values[0].numel() * pixel_values.element_size() if n else 0
            mask = kwargs.pop("patch_attention_mask", None) if masked else None
            if mask is None and masked:  # Idefics3 / SmolVLM: which patches are image
                p = self.config.patch_size
                shape = (n, pixel_values.shape[-2] // p, pixel_values.shape[-1] // p)
                mask = torch.ones(shape, dtype=torch.bool, device=pixel_values.device)
            if masked and len(mask) != n:
                raise ValueError(f"{where}: {len(mask)} patch masks for {n} tiles")
        except Exception as e:  # every rank raises it: plan_items
            n, row_bytes, refusal = 0, 0, e
        route = plan_items(
            np.ones((n, 1), dtype=np.int64),
            lambda t: t[:, 0].astype(np.float64),
            group=group,
            topology=topology,
            policy=policy,
            volume=lambda t: t[:, 0] * float(row_bytes),
            refusal=refusal,
            where=where,
        )
        record(self, route)
        if route.src.size == 0:  # see balance_vision
            if self.equishard_joining:
                return None
            if masked:
                kwargs["patch_attention_mask"] = mask
            return inner(pixel_values, *args, **kwargs)
        x = route.send(pixel_values, 0, "tiles")
        if masked:
            kwargs["patch_attention_mask"] = route.send(mask.to(torch.uint8), 0, "masks").bool()
        out, failure = run_received(route, lambda: inner(x, *args, **kwargs))
        own = not self.equishard_joining
        return route_home(self, out, x, route, group, own_call=own, failure=failure)

    def join(self) -> torch.Tensor:
        # every layer's states too: the model's own calls may select from them
        return joined(self, _empty_pixels(self), output_hidden_states=True, return_dict=True)

    return install(tower, forward, join)


# ----------------------------------------------------------------------------- decoder
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


def _packed_row(inputs_embeds, attention_mask, position_ids):
    """Check that this rank's decoder input is one packed row (batch size 1, no padding, HF's
    position ids restarting per sample; Qwen's ``[4, 1, L]`` with the text row first); returns
    (the 2-D attention mask or None, the model's 4-D masks by name or None, sample lengths)."""
    if inputs_embeds.shape[0] != 1 or position_ids is None:
        raise ValueError(
            "balance_decoder needs one packed row per rank (batch size 1) with position ids "
            f"restarting per sample; got inputs of shape {tuple(inputs_embeds.shape)} and "
            f"position_ids {None if position_ids is None else tuple(position_ids.shape)}"
        )
    # a model that builds its own 4-D masks (Gemma 3) passes them: they move with the samples
    attention_mask, masks = split_masks(attention_mask)
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("balance_decoder takes packed rows without padding (attention_mask)")
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
    vision: torch.nn.Module | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on an HF decoder (``forward(inputs_embeds=...,
    position_ids=...)``, e.g. Qwen2-VL's ``language_model``) fed one packed row per rank.
    ``vision``: a tower wrapped by :func:`balance_vision`; on a step where this rank had no
    images (so the model never called it) the decoder joins the tower's exchange first."""
    policy = policy or RedistributePolicy()
    cfg = getattr(decoder, "config", None)
    if cost_model is None and cfg is not None and getattr(cfg, "hidden_size", None):
        cost_model = CostModel.from_dims(
            vit_hidden=1, vit_layers=1, llm_hidden=cfg.hidden_size, llm_layers=cfg.num_hidden_layers
        )
    llm = (cost_model or policy.cost_model).llm
    inner = decoder.forward

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
        if kw.get("past_key_values") is not None:
            raise ValueError(
                "balance_decoder is for training and got past_key_values (generation?): run "
                "generate() inside `with trainer_adapter.hf_balance.paused(model):`, where "
                "each rank runs its own inputs with no exchange"
            )
        kw.update(use_cache=False, past_key_values=None)
        zero = None
        if vision is not None:  # every rank through as many tower rounds as the busiest
            zero = vision.equishard_settle()
        if not policy.enabled:  # the plain decoder (an empty rank's row never reaches it)
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
        refusal, mine, masks = None, None, None  # see balance_vision
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
            mine = (packing_spec(kw), crossing_masks(masks, lengths), per_token_spec(kw))
        except Exception as e:  # every rank raises it: agree_masks
            refusal, masks = e, None
        reason = None if refusal is None else reason_of(refusal)
        masks, agreed = agree_masks(masks, group, (mine, reason))
        raise_together([r for _, r in agreed], where, refusal)
        agreed = [m for m, _ in agreed]
        spec = {k: v for sp, _, _ in agreed for k, v in sp.items()}
        crossing = sorted({k for _, names, _ in agreed for k in names})
        per_token = _agreed_per_token([tok for _, _, tok in agreed], where)
        if crossing:  # every rank refuses, also one whose row holds a single sample
            raise ValueError(
                f"{where}: the model's {', '.join(crossing)} "
                "lets the samples of a packed row attend to each other (PaliGemma's prefix "
                "block, token_type_ids == 0, spans every sample's image and prompt), so moving "
                "samples would change what they see; HF's packed rows already mix them without "
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
            lambda: inner(inputs_embeds=x[None], position_ids=p, attention_mask=moved_masks, **kw),
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


def balance_model(
    model: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    encoder: bool = True,
    llm: bool = True,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
) -> torch.nn.Module:
    """Balance a ``transformers`` VLM in place: its vision tower (``encoder``) and/or its
    language model (``llm``). Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 / GLM-4.1V
    (``.visual``: patches + ``grid_thw``; Qwen3-VL's deepstack features go both ways),
    InternVL, LLaVA / LLaVA-NeXT / LLaVA-OneVision (``.vision_tower``: tiles), Idefics3 /
    SmolVLM (``.vision_model``: tiles with their patch masks; ``.text_model``), Gemma 3 (tiles;
    its decoder masks move with the samples), Mistral 3 / Pixtral (images of their own sizes:
    :func:`~trainer_adapter.hf_pixtral.balance_pixtral`), Idefics2, Aya Vision, Command A
    Vision, VipLLaVA (tiles), Llama 4 (``.vision_model``: tiles; its ``.language_model`` is a
    causal LM, whose inner decoder is balanced), ERNIE 4.5-VL (a Qwen-style ``.vision_tower``;
    the wrapper follows what the tower's forward takes: ``grid_thw``, ``image_sizes``,
    ``spatial_shapes`` (LFM2-VL: :func:`~trainer_adapter.hf_naflex.balance_naflex`),
    ``pixel_position_ids`` (Gemma 4: :func:`~trainer_adapter.hf_patch_positions.
    balance_patch_positions`) or tiles). Feed each rank one packed row
    (:func:`balance_decoder`'s convention). Returns the model."""
    inner = getattr(model, "model", model)
    decoder = getattr(inner, "language_model", None) or getattr(inner, "text_model", None)
    if decoder is not None and hasattr(decoder, "lm_head"):  # Llama 4: a causal LM; its decoder
        decoder = decoder.model  # runs the samples, its head the rank's own tokens
    tower = next(
        (t for a in ("visual", "vision_tower", "vision_model") if (t := getattr(inner, a, None))),
        None,
    )
    # the wrapper by what the tower's forward takes, whatever the model calls it
    takes = inspect.signature(tower.forward).parameters if tower is not None else {}
    wrap = balance_tiles
    if "grid_thw" in takes:  # Qwen-style: patches + grid_thw (ERNIE 4.5-VL's .vision_tower)
        wrap = balance_vision
    elif "image_sizes" in takes:
        wrap = balance_pixtral  # Mistral 3, Pixtral: images of their own sizes
    elif "spatial_shapes" in takes:
        wrap = balance_naflex  # LFM2-VL's SigLIP2: padded patch rows of each image's grid
    elif "pixel_position_ids" in takes:
        wrap = balance_patch_positions  # Gemma 4: padded patch rows with their positions
    if tower is None or decoder is None:
        raise ValueError(
            f"{type(model).__name__}: no .visual/.vision_tower/.vision_model and "
            ".language_model/.text_model; wrap the tower and the decoder with balance_vision / "
            "balance_tiles / balance_decoder"
        )
    policy = policy or RedistributePolicy()
    off = RedistributePolicy(enabled=False)
    if encoder:
        wrap(tower, group=group, topology=topology, policy=policy)
    if encoder or llm:
        balance_decoder(
            decoder,
            group=group,
            topology=topology,
            policy=policy if llm else off,
            vision=tower if encoder else None,
        )
    return model
