"""Encoder balancing around a Pixtral-style vision tower (Mistral 3, Pixtral).

Such a tower takes a rank's images as ``pixel_values [n, C, H, W]``, each padded to the
largest image of the batch, with each image's own size (``image_sizes [n, 2]``); it cuts each
image to its size, puts the patches of all images in one sequence and attends inside each
image only (block-diagonal), returning ``[1, patches, D]`` for all images together.

:func:`balance_pixtral` spreads the images over the group by modeled encoder cost
(``alpha*patches + beta*patches^2`` per image, like :func:`~trainer_adapter.hf.balance.
balance_vision`), pads them to the largest of the whole group (the padding is cut off
again by the tower), moves each image's size with it, runs the tower on what the rank
received and routes every output (the last and every layer's hidden states) back to the
images' own ranks in their original order, patch rows per image.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer_adapter.hf.packing import PACKING_KEYS, check_item_inputs
from trainer_adapter.hf.rounds import install, joined, length_cost, plan_round, tower_cost
from trainer_adapter.item_outputs import param_zeros, route_home, run_received
from trainer_adapter.redistribute import RedistributePolicy
from trainer_adapter.topology import Topology

__all__ = ["balance_pixtral"]


def _batch_dim(out, op):
    """``op`` on every tensor of a tower output (a ``ModelOutput``, tuples of tensors)."""
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        return op(out)
    if isinstance(out, dict):
        return type(out)(**{k: _batch_dim(v, op) for k, v in out.items() if v is not None})
    return type(out)(_batch_dim(v, op) for v in out)


def balance_pixtral(
    tower: torch.nn.Module,
    *,
    group: dist.ProcessGroup | None = None,
    topology: Topology | None = None,
    policy: RedistributePolicy | None = None,
) -> torch.nn.Module:
    """Install the balanced forward on a Pixtral-style tower (``forward(pixel_values,
    image_sizes)``, see the module doc). Returns the tower; ``tower.last_route`` holds the
    latest plan; ``equishard_join`` / ``equishard_settle`` as for the other towers."""
    policy = policy or RedistributePolicy()
    model = tower_cost(tower, policy).vision
    inner = tower.forward
    p = int(tower.patch_size)
    ctx = {"group": group, "topology": topology, "policy": policy}

    def forward(self, pixel_values=None, image_sizes=None, *args, **kwargs):
        if not self.equishard_joining and (pixel_values is None or len(pixel_values) == 0):
            return inner(pixel_values, image_sizes, *args, **kwargs)  # no round: see hf.rounds
        where = f"{type(self).__name__} (balance_pixtral)"
        refusal = None  # this rank's, raised on every rank by plan_items (group_errors)
        try:
            if policy.enabled:
                check_item_inputs(where, args, kwargs, PACKING_KEYS)
            n, _, height, width = pixel_values.shape
            if image_sizes is None:  # the tower's own default: every image as large as the batch
                image_sizes = [(height, width)] * n
            sizes = torch.as_tensor(image_sizes, dtype=torch.int64).reshape(-1, 2).cpu().numpy()
            if len(sizes) != n or (sizes > (height, width)).any() or (sizes < 1).any():
                raise ValueError(
                    f"{where}: image_sizes {sizes.tolist()[:4]} do not fit {n} images padded to "
                    f"{height} x {width}"
                )
            patches = (sizes[:, 0] // p) * (sizes[:, 1] // p)
            padded = np.tile([height, width], (n, 1))  # the largest of the group pads all
            table = np.column_stack([patches, sizes, padded]).reshape(-1, 5)
            per_pixel = pixel_values[0, :, :1, :1].numel() * pixel_values.element_size() if n else 0
        except Exception as e:  # every rank raises it: plan_items
            table, per_pixel, refusal = None, 0, e
        cost, volume = length_cost(model, policy), lambda t: t[:, 1] * t[:, 2] * float(per_pixel)
        route = plan_round(
            self, table, cost, volume, **ctx, refusal=refusal, where=where, kwargs=kwargs,
            dtypes={"images": getattr(pixel_values, "dtype", None)},
        )  # fmt: skip
        if route.src.size == 0:  # no images anywhere this step: nothing to exchange
            if self.equishard_joining:
                return None
            return inner(pixel_values, image_sizes, *args, **kwargs)
        top, right = int(route.table[:, 3].max()), int(route.table[:, 4].max())
        x = F.pad(pixel_values, (0, right - width, 0, top - height))
        x = route.send(x, np.ones_like(route.src), "images")
        mine = torch.from_numpy(sizes).to(pixel_values.device)
        got = route.send(mine, np.ones_like(route.src), "image_sizes")
        sizes_in = got.to(pixel_values.device)
        out, failure = run_received(
            route, lambda: inner(x, sizes_in, *args, **{**kwargs, **route.settings}), self
        )
        out = _batch_dim(out, lambda t: t[0])  # [1, patches, D] -> patch rows
        own = not self.equishard_joining
        home = route_home(self, out, x, route, group, own_call=own, failure=failure)
        return _batch_dim(home, lambda t: t[None])

    def join(self) -> torch.Tensor:
        cfg = self.config
        empty = param_zeros(self, (0, cfg.num_channels, p, p))
        sizes = torch.zeros(0, 2, dtype=torch.int64)
        return joined(self, empty, sizes, output_hidden_states=True, return_dict=True)

    return install(tower, forward, join)
