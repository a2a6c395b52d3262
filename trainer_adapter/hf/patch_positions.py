"""Encoder balancing around a vision tower that takes padded patch rows with their positions
(Gemma 4).

Such a tower takes a rank's images as ``pixel_values [n, P, C*p*p]``: each image's patches
flattened in rows, padded to ``P`` (a multiple of the pooling kernel's ``k^2``: the
processor's ``max_soft_tokens * k^2``), with ``pixel_position_ids [n, P, 2]`` (each patch's
column and row in its image; ``-1`` marks a padding row). It attends inside each image over the
padded rows (the padding masked), average-pools each ``k x k`` block of patches to one soft
token and returns the soft tokens of all images flattened, ``[tokens, D]``, in image order.

:func:`balance_patch_positions` spreads the images evenly over the group (the padded attention
costs every image the same), pads them to the group's largest ``P`` (padding rows are masked and
pool to nothing: an image's soft tokens do not depend on how far it is padded), moves each
image's positions with it, runs the tower on what the rank received and routes every image's
soft tokens back to its own rank, in the original order. Only ``last_hidden_state`` comes back
(what the model reads); per-layer hidden states stay where they were computed.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer_adapter.hf.naflex import plan_padded_rows
from trainer_adapter.hf.packing import PACKING_KEYS, check_item_inputs
from trainer_adapter.hf.rounds import install, joined
from trainer_adapter.item_outputs import param_zeros, route_home, run_received
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = ["balance_patch_positions"]


def _soft_tokens(positions: torch.Tensor, k: int) -> np.ndarray:
    """Per image, the soft tokens the tower's pooling makes of it: its pooling blocks that hold
    at least one of its patches (padding rows, ``-1``, hold none), numbered as the pooling
    numbers them (column block + (columns // k) * row block)."""
    out = np.zeros(positions.shape[0], dtype=np.int64)
    for i, pos in enumerate(positions.detach().cpu().to(torch.int64)):
        valid = pos[(pos != -1).all(dim=-1)]
        if len(valid):
            across = (int(pos.clamp(min=0)[:, 0].max()) + 1) // k
            blocks = valid[:, 0] // k + across * (valid[:, 1] // k)
            out[i] = int(torch.unique(blocks).numel())
    return out


def balance_patch_positions(
    tower: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on a tower taking ``forward(pixel_values,
    pixel_position_ids)`` (Gemma 4's, see the module doc). Returns the tower;
    ``tower.last_route`` holds the latest plan; ``equishard_join`` / ``equishard_settle`` as
    for the other towers."""
    policy = policy or RedistributePolicy()
    inner = tower.forward
    k = int(tower.config.pooling_kernel_size)
    width = int(tower.patch_embedder.input_proj.in_features)

    def forward(self, pixel_values=None, pixel_position_ids=None, **kw):
        if not self.equishard_joining and (pixel_values is None or len(pixel_values) == 0):
            return inner(pixel_values, pixel_position_ids, **kw)  # no round: see hf.rounds
        where = f"{type(self).__name__} (balance_patch_positions)"
        refusal = None  # this rank's, raised on every rank by plan_items (group_errors)
        try:
            if policy.enabled:
                check_item_inputs(where, (), kw, PACKING_KEYS)
            n, rows = int(pixel_values.shape[0]), int(pixel_values.shape[1])
            if pixel_position_ids is None or pixel_position_ids.shape[:2] != (n, rows):
                got = None if pixel_position_ids is None else tuple(pixel_position_ids.shape)
                raise ValueError(
                    f"{where} needs each image's pixel_position_ids [n, P, 2] beside "
                    f"pixel_values {tuple(pixel_values.shape)}, got {got}"
                )
            tokens = _soft_tokens(pixel_position_ids, k)
        except Exception as e:  # every rank raises it: plan_items
            n, rows, tokens, refusal = 0, 0, None, e
        route = plan_padded_rows(
            self, pixel_values, tokens, group, topology, policy, refusal, where, kw
        )
        if route.src.size == 0:  # no images anywhere this step: nothing to exchange
            if self.equishard_joining:
                return None
            return inner(pixel_values, pixel_position_ids, **kw)
        most = int(route.table[:, 1].max())  # the group's largest padding (a multiple of k^2)
        one = np.ones_like(route.src)
        x = route.send(F.pad(pixel_values, (0, 0, 0, most - rows)), one, "patches")
        pos = F.pad(pixel_position_ids.to(torch.int64), (0, 0, 0, most - rows), value=-1)
        pos = route.send(pos.reshape(n, most * 2), one, "pixel_position_ids").reshape(-1, most, 2)
        pos = pos.to(pixel_position_ids.device, pixel_position_ids.dtype)
        out, failure = run_received(route, lambda: inner(x, pos, **{**kw, **route.settings}), self)
        if out is not None:
            out = type(out)(last_hidden_state=out.last_hidden_state)
        own = not self.equishard_joining
        return route_home(self, out, x, route, group, own_call=own, failure=failure)

    def join(self) -> torch.Tensor:
        empty = param_zeros(self, (0, k * k, width))
        positions = torch.zeros(0, k * k, 2, dtype=torch.int64)
        return joined(self, empty, positions, return_dict=True)

    return install(tower, forward, join)
