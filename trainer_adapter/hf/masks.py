"""Attention masks that the model builds itself for a packed row, moved with their samples.

Some VLMs hand their decoder 4-D masks rather than only position ids: Gemma 3 lets the image
tokens of a sample attend to each other both ways and gives its sliding-window layers a mask
of their own (``{"full_attention": [1, 1, L, L], "sliding_attention": [1, 1, L, L]}``). In a
packed row these masks are block-diagonal, one block per sample. :func:`route_masks` cuts each
sample's block out, moves it with the sample (one exchange per mask, ``L_i^2`` entries per
sample) and puts the blocks the rank received together again, block-diagonal, in the kind the
model uses (bool for SDPA, additive float for eager attention). A mask that lets a sample see
another sample of the row (PaliGemma's prefix block: every ``token_type_ids == 0`` token of the
row, whichever sample it belongs to) is not block-diagonal: :func:`crossing_masks` finds it,
and the decoder refuses it rather than drop what the samples saw of each other.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.exchange import collective_device
from trainer_adapter.item_exchange import ItemRoute

__all__ = ["agree_masks", "crossing_masks", "route_masks", "split_masks"]


def split_masks(attention_mask) -> tuple[torch.Tensor | None, dict | None]:
    """(a plain 2-D padding mask or None, the model's 4-D masks by name or None)."""
    if isinstance(attention_mask, dict):
        return None, dict(attention_mask)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 4:
        return None, {"": attention_mask}
    return attention_mask, None


def agree_masks(masks: dict | None, group, extra=None) -> tuple[dict | None, list]:
    """The masks by the names any rank's model built (an empty rank's model may build none):
    None where this rank has none of that name; None when no rank has any. ``extra``: a small
    picklable value of this rank's, gathered in the same collective; returns (the masks,
    every rank's ``extra``). Collective."""
    got = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, (sorted(masks) if masks else [], extra), group=group)
    union = sorted({k for names, _ in got for k in names})
    return ({k: (masks or {}).get(k) for k in union} or None), [e for _, e in got]


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """Where ``mask`` lets a token attend (bool masks: True; additive: 0), ``[L, L]``."""
    return mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0


def crossing_masks(masks: dict | None, lengths: np.ndarray) -> list[str]:
    """The names of the masks that let a token of one sample of the packed row attend to a
    token of another (anything outside the samples' diagonal blocks)."""
    out = []
    for key, mask in sorted((masks or {}).items()):
        if mask is None or len(lengths) < 2:
            continue
        allowed = _allowed(mask)
        inside = sum(int(allowed[a : a + n, a : a + n].sum()) for a, n in _spans(lengths))
        if int(allowed.sum()) != inside:
            out.append(key or "attention_mask")
    return out


def bidirectional_without_masks(decoder: torch.nn.Module, masks: dict | None) -> list[str]:
    """A decoder whose config makes its own mask bidirectional (``use_bidirectional_attention``
    True or ``"all"``: PaliGemma's Gemma, embedding models) and that got no 4-D masks to
    follow: every token of the packed row sees every other, whatever the positions say. Its
    name, else nothing."""
    cfg = getattr(decoder, "config", None)
    given = any(m is not None for m in (masks or {}).values())
    # True (Gemma 1-3's bool) or "all" (Gemma 4's; its "vision" keeps to each image's tokens)
    if given or getattr(cfg, "use_bidirectional_attention", None) not in (True, "all"):
        return []
    return ["use_bidirectional_attention (its own mask over the whole row, none given)"]


def _spans(lengths: np.ndarray):
    return zip((np.cumsum(lengths) - lengths).tolist(), lengths.tolist(), strict=True)


def _blocks(mask: torch.Tensor | None, lengths: np.ndarray) -> torch.Tensor:
    """Each sample's diagonal block of ``mask`` (True: may attend), flattened in order; a
    missing mask is the causal one."""
    if mask is None:
        parts = [torch.ones(n, n, dtype=torch.bool).tril() for n in lengths]
    else:
        allowed = _allowed(mask)
        parts = [allowed[a : a + n, a : a + n] for a, n in _spans(lengths)]
    if not parts:
        return torch.zeros(0, dtype=torch.bool)
    return torch.cat([p.reshape(-1) for p in parts])


def route_masks(
    masks: dict, lengths: np.ndarray, route: ItemRoute, group, like: torch.Tensor
) -> dict | torch.Tensor | None:
    """The masks of the samples this rank received, block-diagonal, on ``like``'s device (the
    decoder's inputs; additive masks in its dtype). A mask no rank has (the model relies on the
    position ids) stays None."""
    keys = sorted(masks)
    kinds = torch.tensor(  # per mask: does any rank hold one, is any additive (float)
        [[masks[k] is not None, masks[k] is not None and masks[k].dtype.is_floating_point]
         for k in keys],
        dtype=torch.int64,
    ).reshape(-1)  # fmt: skip
    kinds = kinds.to(collective_device(group))
    dist.all_reduce(kinds, op=dist.ReduceOp.MAX, group=group)
    kinds = kinds.cpu().reshape(-1, 2).tolist()
    here = route.table[route.received, 0]
    out = {}
    for key, (held, additive) in zip(keys, kinds, strict=True):
        flat = _blocks(masks[key], lengths).to(like.device, torch.uint8).reshape(-1, 1)
        got = route.send(flat, route.table[:, 0] ** 2, f"mask:{key}")
        if not held:
            out[key] = None
            continue
        size = int(here.sum())
        full = torch.zeros(size, size, dtype=torch.bool, device=got.device)
        at = off = 0
        for n in here.tolist():
            full[at : at + n, at : at + n] = got[off : off + n * n, 0].reshape(n, n).bool()
            at, off = at + n, off + n * n
        if additive:
            full = torch.zeros(full.shape, dtype=like.dtype, device=full.device).masked_fill(
                ~full, torch.finfo(like.dtype).min
            )
        out[key] = full[None, None]
    return out[""] if list(out) == [""] else out
