"""Pipelined LLM stages under ``torch.distributed.pipelining``, fed with fixed-shape microbatches.

``torch.distributed.pipelining`` needs fixed microbatch shapes for a schedule, so each replica's
samples are packed into ``n_microbatches`` rows of one of a few fixed sizes (a ladder,
:func:`bucket_ladder`; each size gets its own schedule, built once and reused): the smallest
size that holds the step's samples (:func:`plan_step`; LPT under the size as a token cap, rows
even), so padding is what balancing left, not the largest sample of the data. Rows are ordered
for 1F1B by MMScale's inter-microbatch reordering. The last stage runs the head on real tokens
only and the loss skips padding. A stage passes ``(hidden, doc)`` on;
``doc`` numbers the samples inside a row (-1 is padding), so attention stays inside each sample.

Busy time per stage is measured for the bubble report: forward by timing the stage's forward,
backward by identity autograd functions at the stage's output and input that stamp the clock when
the gradient passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from balancing import MemoryCapError, inter_microbatch_reorder, post_balance
from trainer_adapter.model import LanguageModel

__all__ = [
    "SCHEDULES",
    "LMLoss",
    "MicrobatchPlan",
    "StageModule",
    "StageTimer",
    "bucket_ladder",
    "doc_rows",
    "make_schedule",
    "pack_rows",
    "plan_microbatches",
    "plan_step",
]

SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")


@dataclass(slots=True)
class StageTimer:
    """Busy seconds of one stage's forward and backward passes since :meth:`reset`."""

    forward: float = 0.0
    backward: float = 0.0
    _open: list = field(default_factory=list)

    def reset(self) -> None:
        self.forward = self.backward = 0.0
        self._open.clear()

    @property
    def busy(self) -> float:
        return self.forward + self.backward


class _Stamp(torch.autograd.Function):
    """Identity; in backward, opens (``start``) or closes a backward interval on the timer."""

    @staticmethod
    def forward(ctx, x, timer, start):
        ctx.timer, ctx.start = timer, start
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        now = time.perf_counter()
        if ctx.start:
            ctx.timer._open.append(now)
        elif ctx.timer._open:
            ctx.timer.backward += now - ctx.timer._open.pop()
        return grad, None, None


def _segments(doc: torch.Tensor) -> list[int]:
    _, counts = torch.unique_consecutive(doc, return_counts=True)
    return counts.tolist()


class StageModule(nn.Module):
    """LLM blocks ``[lo, hi)``; the last stage adds the final norm and the LM head."""

    def __init__(self, llm: LanguageModel, lo: int, hi: int, *, last: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(llm.blocks[lo:hi])
        self.last = last
        if last:
            self.norm, self.head = llm.norm, llm.head
        self.timer = StageTimer()

    def forward(self, h: torch.Tensor, doc: torch.Tensor):
        t0 = time.perf_counter()
        x = h[0]
        if x.requires_grad:
            x = _Stamp.apply(x, self.timer, False)
        # samples fill the row from its start; the padding after them skips the blocks
        n_real = int((doc[0] >= 0).sum())
        y = x[:n_real]
        seg = _segments(doc[0, :n_real])
        for blk in self.blocks:
            y = blk(y, seg)
        if self.last:  # the head runs on the real tokens only; padding rows stay zero
            out = self.head(self.norm(y))
            if n_real < x.shape[0]:
                out = torch.cat([out, out.new_zeros(x.shape[0] - n_real, out.shape[-1])])
        else:
            out = torch.cat([y, x[n_real:]]) if n_real < x.shape[0] else y
        if out.requires_grad:
            out = _Stamp.apply(out, self.timer, True)
        self.timer.forward += time.perf_counter() - t0
        return out[None] if self.last else (out[None], doc)


@dataclass(frozen=True, slots=True)
class MicrobatchPlan:
    """``rows[k]``: positions (into the replica's samples) packed into microbatch k, in the
    order the schedule runs them."""

    rows: tuple[tuple[int, ...], ...]
    tokens: int
    padding: float


def plan_microbatches(
    lengths: np.ndarray,
    n_microbatches: int,
    mb_tokens: int,
    pp: int,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> MicrobatchPlan:
    """Pack samples into rows of at most ``mb_tokens``, then order rows for 1F1B (MMScale)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    try:
        pb = post_balance(lengths, n_microbatches, method="lpt", memory_cap=float(mb_tokens))
    except MemoryCapError as exc:
        raise ValueError(
            f"{int(lengths.sum())} tokens (longest sample {int(lengths.max(initial=0))}) do not "
            f"fit {n_microbatches} microbatches of {mb_tokens} tokens: {exc}; raise mb_tokens "
            "or the number of microbatches"
        ) from None
    rows = [np.flatnonzero(pb.dest == k) for k in range(n_microbatches)]
    cost = np.array([alpha * lengths[r].sum() + beta * (lengths[r] ** 2).sum() for r in rows])
    order = inter_microbatch_reorder(cost, max(pp, 1)) if pp > 1 else np.arange(n_microbatches)
    total = int(lengths.sum())
    return MicrobatchPlan(
        rows=tuple(tuple(int(i) for i in rows[k]) for k in order),
        tokens=total,
        padding=1.0 - total / (n_microbatches * mb_tokens) if mb_tokens else 0.0,
    )


def bucket_ladder(largest: int, ratio: float, smallest: int = 64, multiple: int = 16) -> list[int]:
    """Microbatch row sizes from ``smallest`` up to ``largest``, each about ``ratio`` times the
    one before (rounded up to ``multiple``); ``ratio`` 1 gives ``[largest]``."""
    if ratio <= 1.0 or largest <= smallest:
        return [largest]
    sizes, size = [], float(smallest)
    while size < largest:
        r = int(-(-int(size) // multiple) * multiple)
        if not sizes or r > sizes[-1]:
            sizes.append(r)
        size *= ratio
    return [x for x in sizes if x < largest] + [largest]


def plan_step(
    lengths: np.ndarray, n_microbatches: int, buckets: list[int], pp: int, **cost
) -> tuple[int, MicrobatchPlan]:
    """The smallest row size of ``buckets`` that holds this step's samples (every sample whole,
    rows packed by :func:`plan_microbatches`), and its plan; so the microbatches are sized by the
    step's load, not by the largest sample the data holds."""
    lengths = np.asarray(lengths, dtype=np.float64)
    need = max(lengths.max(initial=0.0), lengths.sum() / n_microbatches)
    last_error = None
    for mb in buckets:
        if mb < need:
            continue
        try:
            return mb, plan_microbatches(lengths, n_microbatches, mb, pp, **cost)
        except ValueError as exc:  # LPT could not pack under this size: the next one
            last_error = exc
    raise ValueError(
        f"no microbatch size up to {buckets[-1]} tokens holds this step's samples "
        f"({int(lengths.sum())} tokens, longest {int(lengths.max(initial=0))}): {last_error}"
    )


def pack_rows(
    x: torch.Tensor, cu_seqlens: np.ndarray, plan: MicrobatchPlan, mb_tokens: int, fill
) -> torch.Tensor:
    """[total, ...] packed samples -> [n_microbatches, mb_tokens, ...] rows per ``plan``
    (differentiable gather; padding takes ``fill``)."""
    pad = x.new_full((1, *x.shape[1:]), fill)
    src = torch.cat([x, pad])
    idx = np.full((len(plan.rows), mb_tokens), x.shape[0], dtype=np.int64)
    for k, row in enumerate(plan.rows):
        parts = [np.arange(cu_seqlens[i], cu_seqlens[i + 1]) for i in row]
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        idx[k, : flat.size] = flat
    return src[torch.from_numpy(idx).to(x.device)]


def doc_rows(plan: MicrobatchPlan, lengths: np.ndarray, mb_tokens: int) -> torch.Tensor:
    """[n_microbatches, mb_tokens] sample number inside each row, -1 for padding."""
    out = np.full((len(plan.rows), mb_tokens), -1, dtype=np.int64)
    for k, row in enumerate(plan.rows):
        out[k, : int(lengths[list(row)].sum())] = np.repeat(np.arange(len(row)), lengths[list(row)])
    return torch.from_numpy(out)


def make_schedule(name: str, stages: list, n_microbatches: int, loss_fn):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if name == "interleaved1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn, scale_grads=False)
    if len(stages) != 1:
        raise ValueError(f"schedule {name} runs one stage per rank, got {len(stages)}")
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)


class LMLoss:
    """Summed next-token cross entropy of a microbatch over ``normalizer`` (the global number of
    target tokens of the step, set before each step), so microbatch losses add up to the mean."""

    def __init__(self, normalizer: float = 1.0) -> None:
        self.normalizer = normalizer

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.reshape(-1)
        keep = target != -100  # padding and non-target positions cost nothing
        logits = logits.reshape(-1, logits.shape[-1])[keep]
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # the loss in at least fp32
        return F.cross_entropy(logits, target[keep], reduction="sum") / self.normalizer
