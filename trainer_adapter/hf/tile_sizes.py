"""Tiles of different sizes in one balanced round of a tile tower.

Most tile towers take tiles of one size (InternVL's 448 px, SmolVLM's 384 px), the same on
every rank. Idefics2's image processor pads a batch's images to the batch's largest, so every
rank's tiles have their own size, and a tile that moves must take the size of the tiles it
joins (the exchange moves rows of one shape; a rank receives into buffers of its own shape).
A tower that masks its patches (``patch_attention_mask``: Idefics2, Idefics3, SmolVLM) runs the
round at the group's largest size: every rank pads its tiles at the bottom and right (zeros,
the patches there masked, as the image processor pads) and cuts its own tiles' per-patch
outputs back to its own patch grid, which is what the model reads them with. The real patches'
outputs do not depend on the padding: the tower attends over real patches only and places
them by the mask. A tower without a mask cannot be padded so; tiles of different sizes there
stop the step on every rank with the sizes named.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer_adapter.group_errors import raise_together
from trainer_adapter.hf.rounds import ROW_DIMS, shape_columns

__all__ = ["crop_patch_outputs", "group_tile_size", "pad_tiles", "tile_table"]


def tile_table(pixel_values: torch.Tensor | None) -> np.ndarray:
    """The round's item table of ``[n, ..., H, W]`` tiles (None: no table of this rank's own):
    one row each, its size, and the shape of its dims before ``H x W`` (``[C]`` for images;
    Molmo2's crops are ``[n, patches, p*p*C]``: none) in :func:`~trainer_adapter.hf.rounds.
    shape_columns`' columns."""
    if pixel_values is None:
        return np.zeros((0, 3 + 1 + ROW_DIMS), np.int64)
    n, (h, w) = int(pixel_values.shape[0]), (int(s) for s in pixel_values.shape[-2:])
    sizes = np.tile(np.array([[1, h, w]], dtype=np.int64), (n, 1))
    return np.hstack([sizes, shape_columns(pixel_values.shape[1:-2], n)])


def group_tile_size(route, masked: bool, where: str) -> tuple[int, int] | None:
    """The size every tile of the round takes (the largest of any rank's; None: no tiles),
    from the round's gathered item table (:func:`tile_table`'s columns). Every rank calls this
    with the same table, so all raise or none does."""
    table = route.table
    if not len(table):
        return None
    sizes = table[:, 1:3]
    if not masked and (sizes != sizes[0]).any():
        reasons: list[str | None] = [None] * route.route.world
        for r, (h, w) in zip(route.src[: route.items], sizes[: route.items], strict=True):
            reasons[int(r)] = f"tiles of {int(h)} x {int(w)} px"
        raise_together(
            reasons,
            f"{where}: tiles of different sizes, which a tower without a patch mask cannot "
            "pad to one size (give every rank tiles of one size, the image processor's fixed "
            "tile size, or balance the decoder only):",
        )
    return int(sizes[:, 0].max()), int(sizes[:, 1].max())


def pad_tiles(
    pixel_values: torch.Tensor, mask: torch.Tensor | None, size: tuple[int, int], patch: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tiles padded at the bottom and right to ``size`` with zeros, their patch masks (``[n,
    H // patch, W // patch]``) to the patch grid of ``size`` with False; no tiles: an empty
    block of that size."""
    h, w = size
    if not len(pixel_values):  # a rank joining the round (its empty tiles at the tower's size)
        pixel_values = pixel_values.new_zeros((0, *pixel_values.shape[1:-2], h, w))
        mask = None if mask is None else mask.new_zeros((0, h // patch, w // patch))
        return pixel_values, mask
    dh, dw = h - pixel_values.shape[-2], w - pixel_values.shape[-1]
    assert dh >= 0 and dw >= 0, (pixel_values.shape, size)
    if dh or dw:
        pixel_values = torch.nn.functional.pad(pixel_values, (0, dw, 0, dh))
    if mask is not None:
        gh, gw = h // patch - mask.shape[-2], w // patch - mask.shape[-1]
        if gh or gw:
            mask = torch.nn.functional.pad(mask, (0, gw, 0, gh), value=False)
    return pixel_values, mask


def crop_patch_outputs(out, padded: tuple[int, int], own: tuple[int, int]):
    """A tower output computed on tiles of the ``padded`` patch grid, its per-patch tensors
    (``[n, gh * gw, ...]``, attention maps ``[n, heads, gh * gw, gh * gw]``) cut to the ``own``
    grid (row-major, as the tower flattens its patches)."""
    (gh, gw), (h, w) = padded, own
    if (gh, gw) == (h, w):
        return out
    full = gh * gw
    keep = torch.zeros(gh, gw, dtype=torch.bool)
    keep[:h, :w] = True
    keep = keep.reshape(-1)

    def cut(t):
        if isinstance(t, list | tuple):
            return type(t)(cut(x) for x in t)
        if not isinstance(t, torch.Tensor) or t.ndim < 2:
            return t
        if t.ndim == 4 and t.shape[2] == t.shape[3] == full:  # attention maps
            return t[:, :, keep.to(t.device)][:, :, :, keep.to(t.device)]
        if t.shape[1] == full:
            return t[:, keep.to(t.device)]
        return t

    if isinstance(out, dict):  # a ModelOutput: its keys and attributes
        for key in list(out.keys()):
            out[key] = cut(out[key])
        return out
    return cut(out)
