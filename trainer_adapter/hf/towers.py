"""Balanced forwards for the vision towers of Hugging Face VLMs (see
:mod:`trainer_adapter.hf.balance`).

* :func:`balance_vision` — around a Qwen-style tower (``model.model.visual`` of Qwen2-VL /
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

A rank's own inputs are checked before the round's gather and a refusal rides on it; the
tower failing on what a rank received rides on the output agreement: every rank raises
(:mod:`trainer_adapter.group_errors`).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.group_errors import raise_together
from trainer_adapter.hf.packing import PACKING_KEYS, check_item_inputs
from trainer_adapter.hf.rounds import (
    group_row_shape,
    install,
    joined,
    length_cost,
    plan_round,
    shape_columns,
    tower_cost,
)
from trainer_adapter.hf.tile_sizes import crop_patch_outputs, group_tile_size, pad_tiles, tile_table
from trainer_adapter.item_outputs import param_zeros, route_home, run_received
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = ["balance_tiles", "balance_vision"]


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
    # refused here without a Qwen-style patch embedding; a rank without images joins with
    # [0, width] and receives rows in the senders' layout (hf.rounds.group_row_shape)
    width = _patch_width(tower)
    ctx = {"group": group, "topology": topology, "policy": policy}

    def forward(self, hidden_states, grid_thw=None, **kwargs):
        if not self.equishard_joining and _none(grid_thw) and _none(hidden_states):
            return inner(hidden_states, grid_thw=grid_thw, **kwargs)  # no round: see hf.rounds
        where = f"{type(self).__name__} (balance_vision)"
        refusal = None  # this rank's, raised on every rank by plan_items (group_errors)
        try:
            if policy.enabled:  # the text's packing kwargs may pass through; nothing else
                check_item_inputs(where, (), kwargs, PACKING_KEYS)
            table = _grid_table(hidden_states, grid_thw, where)
            table = np.hstack([table, shape_columns(hidden_states.shape[1:], len(table))])
            row_bytes = hidden_states[0].numel() * hidden_states.element_size() if len(table) else 0
            dtypes = {"patches": hidden_states.dtype}
        except Exception as e:  # every rank raises it: plan_items
            table, row_bytes, refusal, dtypes = None, 0, e, None
        cost, volume = length_cost(model, policy), lambda t: t[:, 0] * float(row_bytes)
        route = plan_round(
            self, table, cost, volume, **ctx, refusal=refusal, where=where, kwargs=kwargs,
            dtypes=dtypes,
        )  # fmt: skip
        if route.src.size == 0:  # no images anywhere this step: nothing to exchange
            if self.equishard_joining:
                return None
            return inner(hidden_states, grid_thw=grid_thw, **kwargs)
        _refuse_merged_frames(self, route, where)
        shape = group_row_shape(route, 4, "patch rows", where)  # the senders' (Kimi: [C, p, p])
        if not len(hidden_states):  # a joining rank receives rows of that shape
            hidden_states = hidden_states.reshape(0, *shape)
        x = route.send(hidden_states, 0, "patches")
        g = route.send(grid_thw.reshape(-1, 3).to(torch.int64), np.ones_like(route.src), "grid")
        g = g.to(device=grid_thw.device, dtype=grid_thw.dtype)
        out, failure = run_received(
            route, lambda: inner(x, grid_thw=g, **{**kwargs, **route.settings}), self
        )
        own = not self.equishard_joining
        return route_home(self, out, x, route, group, own_call=own, failure=failure)

    def join(self) -> torch.Tensor:
        """Take part in this step's exchange with no images of this rank's own (HF skips the
        tower when ``pixel_values`` is None); returns a zero that the caller adds to its output
        so the reverse exchange runs in the backward too."""
        empty = param_zeros(self, (0, width))
        return joined(self, empty, grid_thw=torch.zeros(0, 3, dtype=torch.int64))

    return install(tower, forward, join)


def _refuse_merged_frames(tower: torch.nn.Module, route, where: str) -> None:
    """A tower that merges each video's frames into one grid (Kimi-K2.5's ``temporal_merge``:
    ``h*w`` rows out for ``t*h*w`` in) with a video in the round: its outputs per item are not
    proportional to the patch rows, and where every rank's mix gives the same ratio the
    ratio check of ``route_home`` cannot see it (a video's rows would go to an image, the
    totals right). Every rank raises, from the same gathered table."""
    if not callable(getattr(tower, "temporal_merge", None)):
        return
    videos = route.table[: route.items, 1] > 1
    if not videos.any():
        return
    per_rank = np.bincount(route.src[: route.items][videos], minlength=route.route.world)
    raise_together(
        [f"{int(k)} video(s)" if k else None for k in per_rank],
        f"{where}: the tower merges each video's frames into one grid (temporal_merge), so a "
        "video's outputs are not proportional to its patch rows and cannot be routed home by "
        "rows; balance images only (videos on no rank) or the decoder only "
        "(balance_model(..., encoder=False)):",
    )


def _none(x) -> bool:
    return x is None or x.numel() == 0


def _grid_table(hidden_states, grid_thw, where: str) -> np.ndarray:
    """The item table of a Qwen-style tower's images: (patch rows, t, h, w) per image; the
    rows must be the patches the grids give."""
    if grid_thw is None:
        raise ValueError(f"{where} was given {len(hidden_states)} patch rows but no grid_thw")
    grid = grid_thw.detach().to("cpu", torch.int64).reshape(-1, 3).numpy()
    if (grid < 1).any():  # negative pairs multiply to a plausible row count: refuse each
        bad = int(np.flatnonzero((grid < 1).any(axis=1))[0])
        raise ValueError(
            f"{where}: grid_thw of image {bad} is {grid[bad].tolist()}; every t, h and w must "
            "be >= 1 (a processor's image_grid_thw)"
        )
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


def _tile_cost(table: np.ndarray) -> np.ndarray:
    """Every tile the same encoder cost."""
    return table[:, 0].astype(np.float64)


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
    takes a ``patch_attention_mask`` (Idefics2, Idefics3, SmolVLM: the patches of a tile that
    are image, not padding) gets each tile's mask with it, and tiles of different sizes on the
    ranks (Idefics2's, padded to each rank's largest image) run at the largest
    (:mod:`trainer_adapter.hf.tile_sizes`). Every per-tile output (last hidden state, pooled
    output, the hidden states of every layer) comes back in the original order."""
    policy = policy or RedistributePolicy()
    inner = tower.forward
    masked = "patch_attention_mask" in inspect.signature(inner).parameters
    ctx = {"group": group, "topology": topology, "policy": policy}

    def forward(self, pixel_values=None, *args, **kwargs):
        if not self.equishard_joining and (pixel_values is None or len(pixel_values) == 0):
            return inner(pixel_values, *args, **kwargs)  # no round: see hf.rounds
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
        table = tile_table(pixel_values if refusal is None else None)
        volume = lambda t: t[:, 0] * float(row_bytes)  # noqa: E731
        route = plan_round(
            self, table, _tile_cost, volume, **ctx, refusal=refusal, where=where, kwargs=kwargs,
            dtypes={"tiles": getattr(pixel_values, "dtype", None)},
        )  # fmt: skip
        if route.src.size == 0:  # see balance_vision
            if self.equishard_joining:
                return None
            if masked:
                kwargs["patch_attention_mask"] = mask
            return inner(pixel_values, *args, **kwargs)
        # the round's tile size (Idefics2: each rank's its own largest image's): hf.tile_sizes
        size = group_tile_size(route, masked, where)
        lead = group_row_shape(route, 3, "tiles", where)  # a tile's dims before its H x W
        if not len(pixel_values):  # a joining rank receives tiles of that layout (Molmo2's)
            pixel_values = pixel_values.new_zeros((0, *lead, *size))
        own_size = tuple(int(s) for s in pixel_values.shape[-2:])
        p = self.config.patch_size if masked else 1
        pixel_values, mask = pad_tiles(pixel_values, mask, size, p)
        x = route.send(pixel_values, 0, "tiles")
        if masked:
            kwargs["patch_attention_mask"] = route.send(mask.to(torch.uint8), 0, "masks").bool()
        out, failure = run_received(
            route, lambda: inner(x, *args, **{**kwargs, **route.settings}), self
        )
        own = not self.equishard_joining
        out = route_home(self, out, x, route, group, own_call=own, failure=failure)
        if own and masked:  # this rank's tiles' patches, on its own patch grid
            grid = lambda hw: (hw[0] // p, hw[1] // p)  # noqa: E731
            out = crop_patch_outputs(out, grid(size), grid(own_size))
        return out

    def join(self) -> torch.Tensor:
        # every layer's states too: the model's own calls may select from them
        # no tiles of its own: their layout and size come from the round's table
        empty = param_zeros(self, (0, 0, 0, 0))
        return joined(self, empty, output_hidden_states=True, return_dict=True)

    return install(tower, forward, join)
