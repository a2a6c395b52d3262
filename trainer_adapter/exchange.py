"""Collectives the redistribution is built from: variable-length all_gather of small integer
tables, and an all_to_all of rows that autograd can differentiate through.

Every rank of the group must call these in the same order (they are collectives). Split sizes
are counted in rows (the first dimension) and may be zero in any direction.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist

from trainer_adapter.group_errors import gather_reasons, raise_together, reason_of

__all__ = ["all_to_all_rows", "collective_device", "gather_tables"]


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where this group's collectives want their tensors: the current GPU for NCCL, else CPU."""
    if dist.get_backend(group) == "nccl":
        current = torch.cuda.current_device()
        local = os.environ.get("LOCAL_RANK")
        if local is not None and torch.cuda.device_count() > 1 and int(local) != current:
            raise RuntimeError(
                f"this process has LOCAL_RANK={local} but its current CUDA device is cuda:{current}"
                ": every rank's NCCL collectives would run on one GPU. Call "
                "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before training"
            )
        return torch.device("cuda", current)
    return torch.device("cpu")


def gather_tables(
    local: np.ndarray | None,
    group: dist.ProcessGroup | None = None,
    *,
    refusal: BaseException | None = None,
    where: str = "gather_tables",
) -> list[np.ndarray]:
    """All ranks' int64 tables ``[n_r, k]`` (``n_r`` may differ, even be 0), in rank order.

    Two collectives: the row counts, then the rows padded to the longest. A rank that cannot
    give its table passes its error as ``refusal`` (``local`` is then ignored): every rank
    raises :class:`~trainer_adapter.group_errors.StepRefused` with it after the counts, named
    ``where`` (see :mod:`trainer_adapter.group_errors`).
    """
    world = dist.get_world_size(group)
    dev = collective_device(group)
    if refusal is None:
        local = np.ascontiguousarray(local, dtype=np.int64)
        if local.ndim != 2:
            refusal = ValueError(f"gather_tables needs a 2-D table, got shape {local.shape}")
    counts = torch.zeros(world, dtype=torch.int64, device=dev)
    mine = torch.tensor(
        [-1 if refusal is not None else local.shape[0]], dtype=torch.int64, device=dev
    )
    _all_gather(counts, mine, group)
    counts = counts.cpu()
    if bool((counts < 0).any()):  # a rank refused: every rank learns why and raises
        reasons = gather_reasons(None if refusal is None else reason_of(refusal), group)
        raise_together(reasons, where, refusal)
    k = local.shape[1]
    longest = int(counts.max())
    padded = torch.zeros(longest, k, dtype=torch.int64)
    padded[: local.shape[0]] = torch.from_numpy(local)
    out = torch.empty(world * longest, k, dtype=torch.int64, device=dev)
    _all_gather(out, padded.to(dev), group)
    out = out.cpu().view(world, longest, k).numpy()
    return [out[r, : int(counts[r])].copy() for r in range(world)]


def _all_gather(out: torch.Tensor, x: torch.Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x, group=group)


def _a2a(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


class _AllToAllRows(torch.autograd.Function):
    """Rows go out by ``send`` counts and come in by ``recv``; gradients take the way back."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _a2a(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _a2a(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def all_to_all_rows(
    x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Send ``x[sum(send[:j]):sum(send[:j+1])]`` to rank j; receive ``recv[i]`` rows from rank i.

    Differentiable when ``x`` requires grad: the backward is the reverse exchange, so every rank
    that took part in the forward must also run the backward (an empty gradient is fine).
    """
    if x.shape[0] != sum(send):
        raise ValueError(f"{x.shape[0]} rows to send but the send counts add up to {sum(send)}")
    send, recv = [int(v) for v in send], [int(v) for v in recv]
    if x.requires_grad:
        return _AllToAllRows.apply(x, send, recv, group)
    return _a2a(x, send, recv, group)
