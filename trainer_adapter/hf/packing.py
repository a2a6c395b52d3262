"""What a balanced HF module may be given, and the packing kwargs that follow the samples.

A wrapper of :mod:`trainer_adapter.hf.balance` moves items (images, tiles, samples) to other
ranks. Every per-item input must move with them, or the module runs the received items with
this rank's own data (wrong shapes at best, silently wrong gradients at worst). So each wrapper
names the per-item inputs it moves, and anything else that is per-item data (a tensor, or a
list of tensors) is refused with an error naming it (Pixtral's ``image_sizes``, Mllama's
``cross_attention_states``) rather than passed on stale.

The exception is HF's packing kwargs (``DataCollatorWithFlattening(return_flash_attn_kwargs=True,
return_seq_idx=True)``): ``cu_seq_lens_q/k``, ``max_length_q/k`` and ``seq_idx`` describe the
sample boundaries of the packed row. They are checked against the boundaries the position ids
give, and rebuilt for the samples a rank received (:func:`packing_kwargs`). Decoders with
recurrent layers (Qwen3.5's linear attention, Mamba, short convolutions) carry state across a
packed row's samples unless given them, so they are required there (:func:`check_decoder`);
and only decoders whose recurrent layers read them (:data:`PACKED_RECURRENT`) are balanced at
all: LFM2's short convolutions, Jamba's, Bamba's, Nemotron-H's or Granite 4's Mamba layers
ignore them in transformers, so their packed rows mix samples, balanced or not.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "PACKED_RECURRENT",
    "PACKING_KEYS",
    "call_settings",
    "check_decoder",
    "check_decoder_inputs",
    "check_item_inputs",
    "check_recurrent",
    "move_per_token",
    "packing_kwargs",
    "packing_spec",
    "per_token_spec",
]

PACKING_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
# per-token inputs of a decoder, ``[1, L, ...]`` beside the row: they move with their tokens
# (ERNIE 4.5-VL's ``moe_mm_token_type_ids`` route vision tokens to its vision experts; Gemma 4's
# ``per_layer_inputs [1, L, layers, D]``, embeddings of each token for every layer, with their
# gradient)
PER_TOKEN_KEYS = ("moe_mm_token_type_ids", "per_layer_inputs")
# decoders (config.model_type) whose recurrent layers hand the packing kwargs to their kernels
# in transformers (`cu_seqlens=kwargs.pop("cu_seq_lens_q")`): Qwen3.5, Qwen3-Next, OLMo hybrid
PACKED_RECURRENT = frozenset({"qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid"})
# layer kinds without state along the row; every other kind (linear_attention, conv, mamba,
# hybrid, ...) carries some from one token to the next
_STATELESS = {"mlp", "moe", "dense"}


def _is_item_data(value) -> bool:
    """A tensor with a dimension (a 0-d one, like ``num_items_in_batch``, is one number for
    the whole step), or a list of them."""
    if isinstance(value, torch.Tensor):
        return value.ndim > 0
    return isinstance(value, list | tuple) and any(_is_item_data(v) for v in value)


def check_item_inputs(where: str, args: tuple, kwargs: dict, moved: tuple[str, ...]) -> None:
    """Refuse tensor inputs of a wrapped module that the wrapper does not move with its items
    (``moved``: the keyword inputs it does move; positional tensors beyond the first never)."""
    extra = [f"positional argument {i + 1}" for i, a in enumerate(args) if _is_item_data(a)]
    extra += [f"`{k}`" for k, v in kwargs.items() if k not in moved and _is_item_data(v)]
    if extra:
        raise ValueError(
            f"{where} was given {', '.join(extra)}: per-item data that equishard does not know "
            "how to move with the items, so the receiving rank would use the wrong ones. This "
            "model is not supported by this wrapper; balance only the other part "
            "(balance_model(..., encoder=False) or llm=False), or open an issue naming the model"
        )


# keyword inputs that select outputs or caching, not how the items are computed (a rank that
# only joins an exchange asks for every output, whatever the model's own calls ask for), and
# the loss's normalizer some models hand on with their kwargs
_OUTPUT_KEYS = frozenset(
    {
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "use_cache",
        "past_key_values",
        "cache",  # transformers 5.24's name for past_key_values
        "num_items_in_batch",
    }
)
_PLAIN = (bool, int, float, str)


def call_settings(kwargs: dict) -> dict:
    """The settings of a wrapped module's call: its keyword inputs that are plain values (or
    tuples / lists of them), not per-item data, not output selection, not the text's packing
    kwargs (Granite Docling's ``fine``, a ``vision_feature_layer``). A rank running another
    rank's items must run them with these (see ``plan_items(settings=)``)."""

    def plain(v) -> bool:
        if isinstance(v, list | tuple):
            return all(plain(x) for x in v)
        return isinstance(v, _PLAIN)

    skip = _OUTPUT_KEYS | set(PACKING_KEYS)
    return {k: v for k, v in sorted(kwargs.items()) if k not in skip and plain(v)}


def packing_spec(kw: dict) -> dict[str, str]:
    """The packing kwargs this rank was given, by name: ``"int"`` or the tensor's dtype (what
    the ranks agree on, so that a rank given none, like an empty one, builds them too)."""
    return {
        k: str(kw[k].dtype) if isinstance(kw[k], torch.Tensor) else "int"
        for k in PACKING_KEYS
        if kw.get(k) is not None
    }


def check_decoder(decoder: torch.nn.Module, kw: dict, lengths: np.ndarray, spec: dict) -> None:
    """The decoder's kwargs before balancing: :func:`check_decoder_inputs` (this rank's own)
    and :func:`check_recurrent` (``spec``: all ranks' :func:`packing_spec`)."""
    check_decoder_inputs(decoder, kw, lengths)
    check_recurrent(decoder, spec)


def check_decoder_inputs(decoder: torch.nn.Module, kw: dict, lengths: np.ndarray) -> None:
    """This rank's decoder kwargs: nothing per-sample is left behind, the packing kwargs agree
    with its position ids' ``lengths``, the per-token inputs are ``[1, L, ...]`` beside the row.
    Local: a wrapper takes its error into the next collective (see hf.balance)."""
    check_item_inputs(
        f"{type(decoder).__name__} (balance_decoder)",
        (),
        kw,
        ("visual_pos_masks", "deepstack_visual_embeds", *PACKING_KEYS, *PER_TOKEN_KEYS),
    )
    length = int(lengths.sum())
    for key in PER_TOKEN_KEYS:
        value = kw.get(key)
        if value is not None and tuple(value.shape[:2]) != (1, length):
            raise ValueError(
                f"balance_decoder: `{key}` must be [1, L, ...] beside the packed row of "
                f"{length} tokens, got {tuple(value.shape)}"
            )
    want = np.concatenate([[0], np.cumsum(lengths)])
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "seq_idx"):
        if kw.get(key) is None:
            continue
        got = kw[key].reshape(-1).detach().cpu().numpy().astype(np.int64)
        if key == "seq_idx":  # the sample index of every token: where it changes
            cuts = np.flatnonzero(np.diff(got)) + 1
            got = np.concatenate([[0], cuts, [got.size]]) if got.size else np.zeros(1, np.int64)
        if got.shape != want.shape or np.any(got != want):
            raise ValueError(
                f"balance_decoder: {key} gives sample boundaries {got.tolist()[:8]}..., the "
                f"position ids (restarting at 0 per sample) give {want.tolist()[:8]}...; "
                "build both from the same packing"
            )


def check_recurrent(decoder: torch.nn.Module, spec: dict) -> None:
    """A decoder with recurrent layers is balanced only where its transformers code takes the
    packing kwargs, and only with them on some rank (``spec``: every rank's
    :func:`packing_spec`, so every rank decides alike)."""
    cfg = getattr(decoder, "config", None)
    # layers that keep a running state along the row (linear attention, mamba, conv, ...);
    # the attention kinds (full, sliding, chunked, ...) get their masks from the positions
    layer_types = set(getattr(cfg, "layer_types", None) or ())
    kinds = {
        k
        for k in layer_types
        if k == "linear_attention" or ("attention" not in k and k not in _STATELESS)
    }
    model_type = getattr(cfg, "model_type", "")
    if kinds and model_type not in PACKED_RECURRENT:
        raise ValueError(
            f"{type(decoder).__name__} ({model_type}) has {'/'.join(sorted(kinds))} layers, "
            "which carry state from one sample of a packed row into the next, and its "
            "transformers code does not take the sample boundaries (HF's packing kwargs) to "
            "stop them: its packed rows mix samples, balanced or not. Balance the vision tower "
            "only (balance_model(..., llm=False)); decoders whose recurrent layers take them: "
            f"{', '.join(sorted(PACKED_RECURRENT))}"
        )
    if kinds and not {"cu_seq_lens_q", "seq_idx"} & set(spec):
        raise ValueError(
            f"{type(decoder).__name__} has {'/'.join(sorted(kinds))} layers, which carry state "
            "from one sample of a packed row into the next unless told where samples end; "
            "pass HF's packing kwargs with each row (cu_seq_lens_q / cu_seq_lens_k / "
            "max_length_q / max_length_k or seq_idx, as DataCollatorWithFlattening("
            "return_flash_attn_kwargs=True) gives them)"
        )


def per_token_spec(kw: dict) -> dict[str, tuple]:
    """The per-token inputs (:data:`PER_TOKEN_KEYS`) this rank was given: their dtypes and the
    shape of one token's entry."""
    return {
        k: (str(kw[k].dtype), tuple(kw[k].shape[2:]))
        for k in PER_TOKEN_KEYS
        if kw.get(k) is not None
    }


def move_per_token(value, key: str, spec: tuple, length: int, route, tie) -> torch.Tensor:
    """A per-token input ``[1, L, ...]`` of this rank's row moved with its samples (``route``:
    the decoder's; ``spec``: its agreed dtype and per-token shape); a rank given none (an empty
    rank, or a model that leaves it out) sends zeros. Floating inputs keep their gradient (it
    flows back through the reverse exchange; ``tie``, a zero in the graph, keeps a rank's zeros
    in it so that every rank takes part). Collective: every rank calls it for every key some
    rank has."""
    dtype, shape = spec
    dt = getattr(torch, dtype.removeprefix("torch."))
    if value is None:
        value = torch.zeros(1, length, *shape, dtype=dt)
        value = value + tie.to(dt) if dt.is_floating_point else value
    if tuple(value.shape) != (1, length, *shape):
        raise ValueError(
            f"balance_decoder: `{key}` must be [1, L, ...] beside the packed row of {length} "
            f"tokens, got {tuple(value.shape)}"
        )
    rows = value.reshape(length, int(np.prod(shape)))  # one row per token, an empty row too
    if not dt.is_floating_point:  # ids and types travel as int64
        return route.send(rows.to(torch.int64), 0, key).reshape(1, -1, *shape).to(dt)
    return route.send(rows, 0, key).reshape(1, -1, *shape)


def packing_kwargs(kw: dict, spec: dict, received: np.ndarray, device: torch.device) -> dict:
    """``kw`` with the packing kwargs named in ``spec`` (the union over ranks) built for the
    received samples' ``received`` lengths; everything else passes through unchanged."""
    out = dict(kw)
    longest = int(received.max()) if received.size else 0
    cu = np.concatenate([[0], np.cumsum(received)])
    idx = np.repeat(np.arange(received.size), received)
    for key, kind in spec.items():
        if key.startswith("max_length"):
            value = longest
        else:
            value = cu if key.startswith("cu_seq_lens") else idx[None]
        if kind != "int":
            value = torch.as_tensor(value, dtype=getattr(torch, kind.removeprefix("torch.")))
            value = value.to(device)
        out[key] = value
    return out
