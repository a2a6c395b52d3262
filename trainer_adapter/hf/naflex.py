"""Encoder balancing around a NaFlex vision tower (SigLIP2 with images of their own sizes:
LFM2-VL).

Such a tower takes a rank's images as ``pixel_values [n, P, C*p*p]``: each image's patches
flattened in rows, padded to ``P`` (the processor's ``max_num_patches``, or the batch's most),
with ``pixel_attention_mask [n, P]`` (which rows are patches) and ``spatial_shapes [n, 2]``
(each image's patch grid). It attends inside each image only, over the padded rows, so every
image costs the same whatever its size; its outputs are per image, ``[n, P, D]``.

:func:`balance_naflex` spreads the images evenly over the group, pads them to the group's
largest ``P`` (padded rows are masked: an image's outputs do not depend on how far it is
padded), moves each image's mask and grid with it, runs the tower on what the rank received
and routes every output back to the images' own ranks in their original order, cut to the
rank's own ``P`` again.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer_adapter.hf.packing import PACKING_KEYS, check_item_inputs
from trainer_adapter.hf.pixtral import _batch_dim
from trainer_adapter.hf.rounds import install, joined, plan_round
from trainer_adapter.item_outputs import param_zeros, route_home, run_received
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = ["balance_naflex", "plan_padded_rows"]

MOVED = ("pixel_attention_mask", "spatial_shapes", *PACKING_KEYS)


def _row_width(tower: torch.nn.Module) -> int:
    """The width of one patch row: what the tower's patch embedding (a Linear) takes."""
    embed = getattr(tower, "vision_model", tower).embeddings.patch_embedding
    return int(embed.in_features)


def plan_padded_rows(tower, pixel_values, out_rows, group, topology, policy, refusal, where, kw):
    """The round's plan for images given as padded patch rows ``[n, P, ...]`` (every image costs
    the same: the tower attends over all ``P`` rows); its item table is (output rows per image,
    ``P``), the bytes moved ``P`` rows per image. Recorded on the tower. ``refusal``: this
    rank's error, raised on every rank (:mod:`trainer_adapter.group_errors`); ``kw``: the
    call's keyword inputs, whose settings the ranks agree on (``route.settings``)."""
    table, per_row = None, 0
    if refusal is None:
        n, rows = int(pixel_values.shape[0]), int(pixel_values.shape[1])
        per_row = pixel_values[0, :1].numel() * pixel_values.element_size() if n else 0
        table = np.column_stack([out_rows, np.full(n, rows)]).reshape(-1, 2)
    ctx = {"group": group, "topology": topology, "policy": policy}
    return plan_round(
        tower,
        table,
        lambda t: np.ones(len(t)),  # padded attention: every image costs the same
        lambda t: t[:, 1] * float(per_row),
        **ctx,
        refusal=refusal,
        where=where,
        kwargs=kw,
        dtypes={"patches": getattr(pixel_values, "dtype", None)},
    )


def balance_naflex(
    tower: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on a NaFlex tower (``forward(pixel_values,
    pixel_attention_mask, spatial_shapes)``, see the module doc). Returns the tower;
    ``tower.last_route`` holds the latest plan; ``equishard_join`` / ``equishard_settle`` as
    for the other towers."""
    policy = policy or RedistributePolicy()
    inner = tower.forward
    width = _row_width(tower)

    def forward(self, pixel_values=None, pixel_attention_mask=None, spatial_shapes=None, **kw):
        if not self.equishard_joining and (pixel_values is None or len(pixel_values) == 0):
            return inner(pixel_values, pixel_attention_mask, spatial_shapes, **kw)  # see hf.rounds
        where = f"{type(self).__name__} (balance_naflex)"
        refusal = None  # this rank's, raised on every rank by plan_items (group_errors)
        try:
            if policy.enabled:
                check_item_inputs(where, (), kw, MOVED)
            n, rows = int(pixel_values.shape[0]), int(pixel_values.shape[1])
            if pixel_attention_mask is None or spatial_shapes is None:
                raise ValueError(
                    f"{where} needs each image's pixel_attention_mask and spatial_shapes "
                    "beside pixel_values"
                )
            if pixel_attention_mask.shape[:2] != (n, rows) or len(spatial_shapes) != n:
                raise ValueError(
                    f"{where}: pixel_attention_mask {tuple(pixel_attention_mask.shape)} and "
                    f"spatial_shapes {tuple(spatial_shapes.shape)} do not match pixel_values "
                    f"{tuple(pixel_values.shape)}"
                )
        except Exception as e:  # every rank raises it: plan_items
            n, rows, refusal = 0, 0, e
        ones = np.ones(n, np.int64)
        route = plan_padded_rows(
            self, pixel_values, ones, group, topology, policy, refusal, where, kw
        )
        if route.src.size == 0:  # no images anywhere this step: nothing to exchange
            if self.equishard_joining:
                return None
            return inner(pixel_values, pixel_attention_mask, spatial_shapes, **kw)
        most = int(route.table[:, 1].max())  # the group's largest padding
        one = np.ones_like(route.src)
        x = route.send(F.pad(pixel_values, (0, 0, 0, most - rows)), one, "patches")
        mask = F.pad(pixel_attention_mask.to(torch.int64), (0, most - rows))
        mask = route.send(mask, one, "pixel_attention_mask")
        shapes = route.send(spatial_shapes.to(torch.int64), one, "spatial_shapes")
        mask = mask.to(pixel_attention_mask.device, pixel_attention_mask.dtype)
        shapes = shapes.to(spatial_shapes.device, spatial_shapes.dtype)
        out, failure = run_received(
            route, lambda: inner(x, mask, shapes, **{**kw, **route.settings}), self
        )
        own = not self.equishard_joining
        home = route_home(self, out, x, route, group, own_call=own, failure=failure)
        # per-patch outputs [n, P, ...] back to this rank's own P; the pooled [n, D] as is
        return _batch_dim(home, lambda t: t[:, :rows] if t.ndim >= 3 else t)

    def join(self) -> torch.Tensor:
        empty = param_zeros(self, (0, 1, width))
        mask = torch.zeros(0, 1, dtype=torch.int64)
        shapes = torch.zeros(0, 2, dtype=torch.int64)
        return joined(self, empty, mask, shapes, output_hidden_states=True, return_dict=True)

    return install(tower, forward, join)
