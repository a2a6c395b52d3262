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
from trainer_adapter.train.pipeline import (
    StageModule,
    doc_rows,
    interval_seconds,
    plan_microbatches,
)


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


def _walled(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def test_a_stage_times_its_forward_and_its_backward_apart():
    """Each pass's time lies between the blocks' sleeps and the wall clock around the call."""
    stage = _stage(fwd_s=0.03, bwd_s=0.05)
    h = torch.randn(1, 8, 64, requires_grad=True)
    (out, _), wall_f = _walled(lambda: stage(h, stage._doc))
    assert 0.06 <= stage.timer.forward <= wall_f
    assert stage.timer.backward == 0.0  # nothing ran backward yet
    _, wall_b = _walled(lambda: out.sum().backward())
    assert 0.06 <= stage.timer.forward <= wall_f
    assert 0.10 <= stage.timer.backward <= wall_b
    assert stage.timer.busy == pytest.approx(stage.timer.forward + stage.timer.backward)
    stage.timer.reset()
    assert stage.timer.busy == 0.0


def test_microbatches_add_up_and_each_backward_is_its_own_interval():
    """Two microbatches forward, then backward in reverse (as 1F1B's cool-down runs them), with
    idle time between the passes that is nobody's busy time."""
    stage = _stage(fwd_s=0.02, bwd_s=0.04, n_blocks=1)
    walls_f, walls_b, outs = [], [], []
    for _ in range(2):
        (out, _), wall = _walled(
            lambda: stage(torch.randn(1, 8, 64, requires_grad=True), stage._doc)
        )
        outs.append(out)
        walls_f.append(wall)
    time.sleep(0.1)
    for out in reversed(outs):
        walls_b.append(_walled(lambda o=out: o.sum().backward())[1])
        time.sleep(0.05)
    assert 0.04 <= stage.timer.forward <= sum(walls_f)
    assert 0.08 <= stage.timer.backward <= sum(walls_b)
    assert len(stage.timer._forward) == len(stage.timer._backward) == 2


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
    assert interval_seconds(pairs) == pytest.approx(0.0265)
    assert all(end.waited for _, end in pairs)
    assert interval_seconds([(1.0, 1.25), (2.0, 2.5)]) == pytest.approx(0.75)


def test_the_lm_head_and_loss_count_as_their_stage_s_busy_time():
    """The schedule runs the LM head and the loss after the last stage's forward; with the
    stage's timer they are its passes (the head sleeps a set time per chunk, forward and
    backward)."""
    from trainer_adapter.train.loss import ChunkedLMLoss
    from trainer_adapter.train.pipeline import StageTimer

    class SlowHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 40)

        def forward(self, h):
            return _Sleep.apply(self.lin(h), 0.02, 0.03)

    loss_fn = ChunkedLMLoss(SlowHead(), chunk_tokens=4, normalizer=1.0)
    hidden = torch.randn(1, 8, 16, requires_grad=True)
    target = torch.randint(0, 40, (1, 8))
    target[0, :2] = -100  # 6 targets: 2 chunks
    loss_fn(hidden, target).backward()  # warm-up (first calls import and allocate), untimed
    loss_fn.timer = timer = StageTimer()
    loss, wall_f = _walled(lambda: loss_fn(hidden, target))
    assert 0.04 <= timer.forward <= wall_f
    t0 = time.perf_counter()
    loss.backward()  # each chunk's head runs again (recomputed) and backward
    wall = time.perf_counter() - t0
    assert 2 * (0.02 + 0.03) <= timer.backward <= wall
    assert len(timer._forward) == len(timer._backward) == 1


def _last_stage_timer(rank, world, gen):
    from shards import open_generation
    from trainer_adapter import TrainConfig, Trainer, VLMConfig
    from trainer_adapter.train.loop import build_collator

    cfg = TrainConfig(shards=gen, dp=1, pp=2, steps=1, microbatches=2)
    collate = build_collator(cfg, open_generation(gen))
    mcfg = VLMConfig.preset("tiny", vocab_size=collate.vocab_size, patch_dim=588, merge=2)
    trainer = Trainer(cfg, mcfg, mb_tokens=64)
    return [trainer.loss_fn.timer is st.timer for st in trainer.stages if st.last]


def test_the_trainer_times_its_loss_on_the_last_stage(train_generation):
    if torch.torch_version.TorchVersion(torch.__version__) < (2, 13):
        pytest.skip("pipeline parallelism needs torch >= 2.13")
    from tests.dist_helper import run_ranks

    got = run_ranks(_last_stage_timer, 2, str(train_generation), timeout=120)
    assert got == [[], [True]]  # rank 1 holds the last stage, whose timer the loss shares


def _head_rows(rank, world, gen, share):
    from shards import open_generation
    from trainer_adapter import TrainConfig, Trainer, VLMConfig
    from trainer_adapter.train import model as M
    from trainer_adapter.train.loop import build_collator

    rows = []
    logits = M.LanguageModel.logits

    def recording(self, x):
        rows.append(x.shape[0])
        return logits(self, x)

    M.LanguageModel.logits = recording
    cfg = TrainConfig(shards=gen, dp=1, pp=2, steps=1, microbatches=2)
    collate = build_collator(cfg, open_generation(gen))
    mcfg = VLMConfig.preset("tiny", vocab_size=collate.vocab_size, patch_dim=588, merge=2)
    Trainer(cfg, mcfg, mb_tokens=64, target_share=share)
    return rows


@pytest.mark.parametrize("share", [1.0, 0.25])
def test_the_partition_times_the_head_at_the_target_positions_only(train_generation, share):
    """Rank 0 times each pipelined layer to search the partition: the LM head must run as in
    training, over the row's target positions (here a share of its 64 tokens), forward and
    the backward's recompute, not over every token."""
    if torch.torch_version.TorchVersion(torch.__version__) < (2, 13):
        pytest.skip("pipeline parallelism needs torch >= 2.13")
    from tests.dist_helper import run_ranks

    rows = run_ranks(_head_rows, 2, str(train_generation), share, timeout=120)[0]
    assert rows and set(rows) == {round(share * 64)}, rows


def test_the_target_share_is_the_labelled_share_of_the_first_groups(train_generation):
    """Reference: the collator's labels of the same groups, counted here."""
    from shards import open_generation, read_group
    from trainer_adapter import TrainConfig
    from trainer_adapter.train.loop import build_collator, target_share

    m = open_generation(train_generation)
    collate = build_collator(TrainConfig(shards=str(train_generation), dp=1), m)
    index = m.group_index()
    labels = torch.cat(
        [collate(read_group(m.path, *index[k])[0])["labels"] for k in sorted(index)[:3]]
    )
    want = float((labels != -100).float().mean())
    assert 0 < want < 1  # image tokens and prompts have no target
    assert target_share(m, collate, groups=3) == pytest.approx(want)
