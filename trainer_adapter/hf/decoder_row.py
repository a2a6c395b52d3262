"""A rank's packed row as :func:`~trainer_adapter.hf.decoder.balance_decoder` reads it before
any collective: the samples' boundaries (from the positions), the 4-D masks a model built, the
per-sample table (length, visual tokens, deepstack layers), and what every rank must agree on
(packing kwargs, masks that join samples, per-token inputs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from trainer_adapter.hf.masks import bidirectional_without_masks, crossing_masks, split_masks
from trainer_adapter.hf.packing import (
    call_settings,
    check_decoder_inputs,
    packing_spec,
    per_token_spec,
)

__all__ = ["Row", "agreed_per_token", "read_row", "refuse_crossing"]


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


def agreed_per_token(specs: list[dict], where: str) -> dict:
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


@dataclasses.dataclass
class Row:
    """This rank's packed row as the balanced forward reads it, before any collective."""

    inputs_embeds: torch.Tensor | None = None
    masks: object = None
    lengths: np.ndarray | None = None
    table: np.ndarray | None = None  # per sample: length, visual tokens, deepstack layers
    vmask: torch.Tensor | None = None  # Qwen3-VL's visual-token mask
    deep: list | None = None  # Qwen3-VL's deepstack features
    mine: tuple | None = None  # (packing spec, masks that join samples, per-token spec)
    settings: dict | None = None


def read_row(self, input_ids, attention_mask, position_ids, inputs_embeds, kw, where) -> Row:
    """Check this rank's row and take apart what travels with its samples (``kw`` loses the
    per-sample inputs); raises what makes the row unusable."""
    row = Row()
    row.inputs_embeds = inputs_embeds
    if inputs_embeds is None:
        row.inputs_embeds = self.get_input_embeddings()(input_ids)
    _, row.masks, row.lengths = _packed_row(row.inputs_embeds, attention_mask, position_ids)
    # the head computes the loss on the home rank; a decoder without a head does not read the
    # labels some models hand it (Gemma 4), so they stay home
    kw.pop("labels", None)
    check_decoder_inputs(self, kw, row.lengths)  # nothing per-sample left behind
    # Qwen3-VL's deepstack: per visual token, features added in the first decoder layers; they
    # travel with their samples (table: length, visual tokens, layers)
    row.vmask = kw.pop("visual_pos_masks", None)
    row.deep = kw.pop("deepstack_visual_embeds", None)
    row.table = _sample_table(row.lengths, row.vmask, row.deep, where)
    # the masks that join samples, the packing kwargs, the per-token inputs (their dtypes and
    # per-token shapes): agreed in one collective with the refusals
    joins = crossing_masks(row.masks, row.lengths) + bidirectional_without_masks(self, row.masks)
    row.mine = (packing_spec(kw), joins, per_token_spec(kw))
    row.settings = call_settings(kw) if row.lengths.size else None  # see plan_items
    return row


def refuse_crossing(crossing: list, where: str) -> None:
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
