"""A pipeline stage's busy time (``StageTimer``), which the trainer's bubble per stage is made of.
Reference: stages whose blocks take a known time (they sleep a set number of milliseconds in
forward and in backward), and, for the CUDA path's bookkeeping, events whose elapsed times are
given.

Planted bugs this catches: a backward interval opened and closed on the wrong stamps (it would
measure the forward, or nothing), the forward clocked before the blocks ran, intervals that
survive ``reset``, an event pair read without waiting for its end or in milliseconds."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from trainer_adapter.train.model import LanguageModel, VLMConfig
from trainer_adapter.train.pipeline import StageModule, _seconds, doc_rows, plan_microbatches


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd_s, bwd_s):
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_s)
        return grad, None, None


class _SlowBlock(nn.Module):
    def __init__(self, fwd_s: float, bwd_s: float) -> None:
        super().__init__()
        self.fwd_s, self.bwd_s = fwd_s, bwd_s
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x, seg_lens):
        return _Sleep.apply(x * self.w, self.fwd_s, self.bwd_s)


def _stage(fwd_s: float, bwd_s: float, n_blocks: int = 2) -> StageModule:
    import numpy as np

    llm = LanguageModel(VLMConfig.preset("tiny", vocab_size=50))
    llm.blocks = nn.ModuleList(_SlowBlock(fwd_s, bwd_s) for _ in range(n_blocks))
    stage = StageModule(llm, 0, n_blocks, last=False)
    lengths = np.array([5, 3])
    plan = plan_microbatches(lengths, 1, 8, 1, split=False)
    stage._doc = doc_rows(plan, lengths, 8)
    return stage


def test_a_stage_times_its_forward_and_its_backward_apart():
    stage = _stage(fwd_s=0.03, bwd_s=0.05)
    h = torch.randn(1, 8, 64, requires_grad=True)
    out, _ = stage(h, stage._doc)
    assert stage.timer.forward == pytest.approx(0.06, abs=0.03)
    assert stage.timer.backward == 0.0  # nothing ran backward yet
    out.sum().backward()
    assert stage.timer.forward == pytest.approx(0.06, abs=0.03)
    assert stage.timer.backward == pytest.approx(0.10, abs=0.04)
    assert stage.timer.busy == pytest.approx(stage.timer.forward + stage.timer.backward)
    stage.timer.reset()
    assert stage.timer.busy == 0.0


def test_microbatches_add_up_and_each_backward_is_its_own_interval():
    """Two microbatches forward, then backward in reverse (as 1F1B's cool-down runs them)."""
    stage = _stage(fwd_s=0.02, bwd_s=0.04, n_blocks=1)
    outs = [stage(torch.randn(1, 8, 64, requires_grad=True), stage._doc)[0] for _ in range(2)]
    time.sleep(0.1)  # idle between passes: not busy time
    for out in reversed(outs):
        out.sum().backward()
        time.sleep(0.05)
    assert stage.timer.forward == pytest.approx(0.04, abs=0.03)
    assert stage.timer.backward == pytest.approx(0.08, abs=0.04)


class _Event:
    """Stands in for a CUDA timing event: its time in milliseconds, and whether it was waited on."""

    def __init__(self, ms: float) -> None:
        self.ms, self.waited = ms, False

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, end: _Event) -> float:
        assert end.waited, "an event read before it was waited on"
        return end.ms - self.ms


def test_event_intervals_are_waited_on_and_read_in_seconds():
    pairs = [(_Event(10.0), _Event(35.0)), (_Event(40.0), _Event(41.5))]
    assert _seconds(pairs) == pytest.approx(0.0265)
    assert all(end.waited for _, end in pairs)
    assert _seconds([(1.0, 1.25), (2.0, 2.5)]) == pytest.approx(0.75)
