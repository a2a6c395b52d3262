"""Pipelined LLM stages under ``torch.distributed.pipelining``, fed with fixed-shape microbatches.

Each replica's samples are packed into ``n_microbatches`` rows of one of a few fixed sizes, the
smallest that holds the step (:mod:`trainer_adapter.train.microbatches`; samples may be cut across rows,
:mod:`trainer_adapter.train.split_samples`). The last stage runs the head on real tokens only and the
loss skips padding. A stage passes ``(hidden, doc)`` on; ``doc`` codes each token's sample
(``2 * sample + goes_on``, -1 is padding), so attention stays inside each sample and a cut
sample's pieces attend across the cut.

Busy time per stage is measured for the bubble report: forward by timing the stage's forward,
backward by identity autograd functions at the stage's output and input that stamp the clock when
the gradient passes (on a GPU after a synchronize, so the kernels are timed, not their launch).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trainer_adapter.train.config import SCHEDULES
from trainer_adapter.train.microbatches import (
    MicrobatchPlan,
    bucket_ladder,
    doc_rows,
    pack_rows,
    plan_microbatches,
    plan_step,
)
from trainer_adapter.train.model import LanguageModel
from trainer_adapter.train.split_samples import SampleCarry

__all__ = [
    "SCHEDULES",
    "LMLoss",
    "MicrobatchPlan",
    "StageModule",
    "StageTimer",
    "bucket_ladder",
    "device_mark",
    "doc_rows",
    "interval_seconds",
    "make_schedule",
    "pack_rows",
    "plan_microbatches",
    "plan_step",
    "row_layout",
    "row_layouts",
    "timed_pass",
]


@dataclass(slots=True)
class StageTimer:
    """Busy seconds of one stage's forward and backward passes since :meth:`reset`.

    Each pass is an interval between two marks (``device_mark``): on CUDA a pair of timing events
    recorded on the compute stream, so a step takes no host sync per microbatch (a sync there
    also stops the host from queuing the next microbatch's kernels while this one runs); the
    sums are read after the step, and reading waits for the last event only. Elsewhere the
    marks are ``perf_counter`` readings."""

    _forward: list = field(default_factory=list)  # (start, end) marks
    _backward: list = field(default_factory=list)
    _open: list = field(default_factory=list)  # backward starts awaiting their end

    def reset(self) -> None:
        self._forward.clear()
        self._backward.clear()
        self._open.clear()

    @property
    def forward(self) -> float:
        return interval_seconds(self._forward)

    @property
    def backward(self) -> float:
        return interval_seconds(self._backward)

    @property
    def busy(self) -> float:
        return self.forward + self.backward


def device_mark(t: torch.Tensor):
    """A point on ``t``'s device timeline: a timing event recorded on its current stream (CUDA:
    kernels run asynchronously, and only the compute stream is marked, never NCCL's, where a
    posted receive waits on a peer stage), else the host clock."""
    if t.is_cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(t.device))
        return event
    return time.perf_counter()


def interval_seconds(intervals: list) -> float:
    """The summed length of ``(start, end)`` pairs of :func:`device_mark` marks (waits for each
    end event on CUDA)."""
    total = 0.0
    for start, end in intervals:
        if isinstance(start, float):
            total += end - start
        else:
            end.synchronize()
            total += start.elapsed_time(end) / 1000.0
    return total


class _Stamp(torch.autograd.Function):
    """Identity; in backward, opens (``start``) or closes a backward interval on the timer."""

    @staticmethod
    def forward(ctx, x, timer, start):
        ctx.timer, ctx.start = timer, start
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        now = device_mark(grad)
        if ctx.start:
            ctx.timer._open.append(now)
        elif ctx.timer._open:
            ctx.timer._backward.append((ctx.timer._open.pop(), now))
        return grad, None, None


def timed_pass(timer: StageTimer | None, fn, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` as one pass on ``timer``: its forward from before to after, and its backward
    from the output's gradient arriving to the input's leaving (the stamps around it)."""
    if timer is None:
        return fn(x)
    t0 = device_mark(x)
    if x.requires_grad:
        x = _Stamp.apply(x, timer, False)
    out = fn(x)
    if out.requires_grad:
        out = _Stamp.apply(out, timer, True)
    timer._forward.append((t0, device_mark(out)))
    return out


class StageModule(nn.Module):
    """LLM blocks ``[lo, hi)``; the last stage adds the final norm and holds the LM head, which
    its loss runs (``trainer_adapter.train.loss.ChunkedLMLoss``: no full logits)."""

    def __init__(self, llm: LanguageModel, lo: int, hi: int, *, last: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(llm.blocks[lo:hi])
        self.last = last
        if last:
            self.norm, self.head = llm.norm, llm.head
        self.timer = StageTimer()
        self.carry = SampleCarry()  # keys/values of a sample cut across microbatches
        # this step's row layouts in forward order (``row_layouts``), set by the trainer; a
        # stage's forwards run its microbatches in order under every schedule here
        self.host_rows: deque | None = None

    def forward(self, h: torch.Tensor, doc: torch.Tensor):
        out = timed_pass(self.timer, lambda x: self._run(x, doc), h[0])
        return out[None] if self.last else (out[None], doc)

    def _run(self, x: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
        # samples fill the row from its start; the padding after them skips the blocks. The
        # layout comes from the host where the trainer gave it (no device sync per microbatch)
        n_real, codes, seg = self.host_rows.popleft() if self.host_rows else row_layout(doc[0])
        y = x[:n_real]
        cont = bool(codes) and self.carry.continues(codes[0] // 2)
        # the piece cut at this row's end (odd code): it goes on in the next row of its chain
        keep = next((i for i, c in enumerate(codes) if c % 2), None)
        if cont or keep is not None:  # a sample cut across microbatches: attend across the cut
            kvs = []
            for i, blk in enumerate(self.blocks):
                y, kv = blk.forward_chunk(y, seg, self.carry.prefix(i) if cont else None, keep)
                kvs.append(kv)
            self.carry.push(
                None if keep is None else codes[keep] // 2, kvs, extends=cont and keep == 0
            )
        else:
            self.carry.reset()
            for blk in self.blocks:
                y = blk(y, seg)
        if self.last:  # the final norm on the real tokens (padding rows stay zero); the LM
            # head runs inside the loss, chunked at the target positions (ChunkedLMLoss), which
            # times its passes on this stage's timer
            out = self.norm(y)
            if n_real < x.shape[0]:
                out = torch.cat([out, out.new_zeros(x.shape[0] - n_real, out.shape[-1])])
            return out
        return torch.cat([y, x[n_real:]]) if n_real < x.shape[0] else y


def row_layout(doc_row: torch.Tensor) -> tuple[int, list[int], list[int]]:
    """(real tokens, segment codes, segment lengths) of one ``doc_rows`` row."""
    n_real = int((doc_row >= 0).sum())
    codes, counts = torch.unique_consecutive(doc_row[:n_real], return_counts=True)
    return n_real, codes.tolist(), counts.tolist()


def row_layouts(doc: torch.Tensor) -> deque:
    """Every row's ``row_layout`` of a host ``doc_rows`` tensor, in microbatch order."""
    return deque(row_layout(row) for row in doc)


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
