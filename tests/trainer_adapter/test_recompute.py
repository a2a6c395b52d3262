"""Adaptive recomputation: the decision steps against a memory model, and for real on a GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from trainer_adapter.train.recompute import adaptive_recompute, set_recompute


@dataclass
class _Blk:
    recompute: bool = False


def _memory(vit, llm, base, per_v, per_t, limit, extra=0.0):
    """Peak = base + per-block activations of the blocks that keep them; OOM over ``limit``."""

    def measure(step):
        step()
        kept_v = sum(not b.recompute for b in vit)
        kept_t = sum(not b.recompute for b in llm)
        peak = base + kept_v * per_v + kept_t * per_t + (extra if kept_v and kept_t else 0.0)
        if peak > limit:
            raise torch.OutOfMemoryError("simulated")
        return peak

    return measure


def test_turns_off_recomputation_where_memory_allows():
    vit, llm = [_Blk() for _ in range(6)], [_Blk() for _ in range(8)]
    steps = []
    r = adaptive_recompute(
        lambda: steps.append(1),
        vit,
        llm,
        budget=100.0,
        safety=1.0,
        measure=_memory(vit, llm, 40.0, 10.0, 4.0, limit=100.0),
        time_per_layer=(1.0, 1.0),
    )
    assert r.remaining == 60.0 and r.saving_vit == 10.0 and r.saving_llm == 4.0
    # LLM blocks save more time per byte (1/4 > 1/10): all 8 (32), then 2 ViT blocks (20)
    assert (r.vit_plain, r.llm_plain) == (2, 8)
    assert r.peak <= 100.0 and len(steps) == r.trials == 4
    assert sum(not b.recompute for b in vit) == 2


def test_falls_back_stepwise_when_the_estimate_is_too_optimistic():
    vit, llm = [_Blk() for _ in range(4)], [_Blk() for _ in range(4)]
    # mixing plain ViT and LLM blocks costs 15 more than the per-block estimates say
    r = adaptive_recompute(
        lambda: None,
        vit,
        llm,
        budget=100.0,
        safety=1.0,
        measure=_memory(vit, llm, 40.0, 10.0, 5.0, limit=100.0, extra=15.0),
    )
    assert r.peak <= 100.0 and r.trials > 4
    assert (
        40.0 + r.vit_plain * 10 + r.llm_plain * 5 + (15 if r.vit_plain and r.llm_plain else 0)
        <= 100.0
    )


def test_a_peak_over_the_budget_is_a_failed_trial_without_a_real_oom():
    vit, llm = [_Blk() for _ in range(4)], [_Blk() for _ in range(4)]
    trials = []
    measure = _memory(vit, llm, 40.0, 10.0, 5.0, limit=1000.0, extra=15.0)

    def counted(step):
        peak = measure(step)
        trials.append(peak)
        return peak

    r = adaptive_recompute(lambda: None, vit, llm, budget=100.0, safety=1.0, measure=counted)
    # the device never ran out, yet the first full trial (115 > 100) was rejected
    assert max(trials) > 100.0 and r.trials > 4
    assert r.peak <= 100.0 and trials[-1] == r.peak


def test_ranks_run_the_same_trials_and_end_at_all_recomputed_when_out_of_trials():
    vit, llm = [_Blk() for _ in range(3)], [_Blk() for _ in range(3)]
    # this rank fits everything, but a peer always reports out-of-memory after the probes
    calls = []

    def agree(oom):
        calls.append(oom)
        return oom or len(calls) > 3

    r = adaptive_recompute(
        lambda: None,
        vit,
        llm,
        budget=100.0,
        measure=_memory(vit, llm, 10.0, 1.0, 1.0, limit=100.0),
        agree=agree,
        max_trials=9,
    )
    assert r.trials == 9 and len(calls) >= 9  # kept stepping with its peers, never raised alone
    assert (r.vit_plain, r.llm_plain) == (0, 0)
    assert all(b.recompute for b in vit + llm)


def test_out_of_memory_with_everything_recomputed_is_an_error():
    vit, llm = [_Blk()], [_Blk()]
    for limit in (10.0, 1000.0):  # a real OOM, or a peak over the budget
        with pytest.raises(RuntimeError, match="every block recomputed"):
            adaptive_recompute(
                lambda: None,
                vit,
                llm,
                budget=10.0,
                measure=_memory(vit, llm, 50.0, 1.0, 1.0, limit=limit),
            )


def test_needs_cuda_without_a_measure():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device exists")
    with pytest.raises(ValueError, match="CUDA"):
        adaptive_recompute(lambda: None, [], [], budget=1.0)


def test_recomputed_block_gives_the_same_gradients():
    from trainer_adapter.train.model import Block

    torch.manual_seed(0)
    blk = Block(16, 2, 2, causal=True)
    x = torch.randn(12, 16, requires_grad=True)
    blk(x, [5, 7]).square().sum().backward()
    g = x.grad.clone()
    x.grad = None
    set_recompute([blk], 0)
    blk(x, [5, 7]).square().sum().backward()
    torch.testing.assert_close(x.grad, g)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_adaptive_recompute_on_a_real_gpu():
    from trainer_adapter.train.model import VisionLanguageModel, VLMConfig

    torch.manual_seed(0)
    dev = torch.device("cuda")
    m = VisionLanguageModel(VLMConfig.preset("small", vocab_size=1024, patch_dim=588)).to(dev)
    hw = torch.tensor([[32, 32]] * 8)
    patches = torch.randn(8 * 1024, 588, device=dev)

    def step():
        out = m.encode_images(patches, hw)
        ids = torch.randint(0, 1024, (4096,), device=dev)
        h = m.llm.forward_blocks(m.llm.tok(ids) + out.sum() * 0, [1024] * 4)
        m.llm.logits(h).float().square().mean().backward()
        m.zero_grad(set_to_none=True)

    budget = torch.cuda.get_device_properties(dev).total_memory * 0.5
    r = adaptive_recompute(step, list(m.vision.blocks), list(m.llm.blocks), budget)
    assert r.peak <= budget
    assert r.saving_vit > 0 and r.saving_llm > 0


def test_probes_only_run_when_every_rank_has_the_margin_free():
    """A peer without the safety margin free: no rank probes (a probe's extra memory is not
    known yet, and a real OOM inside a collective would stall the others); all stay recomputed."""
    vit, llm = [_Blk() for _ in range(2)], [_Blk() for _ in range(2)]
    seen = []

    def measure(step):
        seen.append((sum(not b.recompute for b in vit), sum(not b.recompute for b in llm)))
        return 50.0

    calls = []

    def agree(flag):  # the second question is the margin check: a peer answers "no margin"
        calls.append(flag)
        return flag or len(calls) == 2

    r = adaptive_recompute(lambda: None, vit, llm, budget=100.0, measure=measure, agree=agree)
    assert seen[0] == (0, 0) and all(s == (0, 0) for s in seen)
    assert (r.vit_plain, r.llm_plain) == (0, 0)


def test_optimizer_state_is_primed_without_changing_training():
    from trainer_adapter.train.recompute import prime_optimizer_state

    def run(prime: bool):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
        if prime:
            before = [p.detach().clone() for p in model.parameters()]
            prime_optimizer_state(opt)
            assert len(opt.state) == 2  # the moments exist before the first step
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        for _ in range(3):
            model(torch.ones(2, 4)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(True), run(False), strict=True))


def test_plans_for_a_heavier_step_than_the_trial_batch():
    """Trials on a batch half as heavy as the largest group: activations measured at half their
    worst size. Planned with the ratio, the heaviest step fits the budget; planned on the trial
    batch alone, it would not (what an H100 run showed: later steps over the budget)."""
    from trainer_adapter.train.recompute import scaled_peak

    static, per_v, per_t, base_act = 30.0, 4.0, 3.0, 10.0

    def plan(ratio):
        vit, llm = [_Blk() for _ in range(6)], [_Blk() for _ in range(8)]
        # the trial batch: activations at 1/2 of the heaviest step's
        trial = _memory(vit, llm, static + base_act / 2, per_v / 2, per_t / 2, limit=1e9)
        r = adaptive_recompute(
            lambda: None,
            vit,
            llm,
            budget=80.0,
            safety=1.0,
            measure=scaled_peak(trial, static, ratio),
        )
        heaviest = static + base_act + r.vit_plain * per_v + r.llm_plain * per_t
        return r, heaviest

    naive, naive_peak = plan(1.0)
    r, peak = plan(2.0)
    assert naive_peak > 80.0  # the first batch's plan overflows on the heaviest step
    assert peak <= 80.0 and r.peak == pytest.approx(peak)
    assert r.vit_plain + r.llm_plain < naive.vit_plain + naive.llm_plain
    with pytest.raises(ValueError, match="ratio"):
        scaled_peak(lambda step: 0.0, 0.0, 0.5)


def test_heaviest_ratio_from_the_generation_loads():
    from trainer_adapter.train.run_setup import heaviest_ratio as _heaviest_ratio

    batch = {"llm_lens": torch.tensor([100, 300]), "vit_lens": torch.tensor([0, 1000])}
    loads = {"max_group_llm_tokens": 600, "max_group_vit_tokens": 3000}
    assert _heaviest_ratio(loads, batch) == 3.0  # the encoder's ratio is the larger
    assert _heaviest_ratio(None, batch) == 1.0
    empty = {"llm_lens": torch.zeros(0), "vit_lens": torch.zeros(0)}
    assert _heaviest_ratio(loads, empty) == 1.0


@pytest.mark.parametrize(("times", "want"), [((4.0, 1.0), (6, 0)), ((1.0, 4.0), (2, 8))])
def test_the_kind_that_saves_more_time_per_byte_goes_first(times, want):
    """ViT blocks save 10 bytes each, LLM blocks 4; 60 bytes free. Each kind's time per layer
    decides the order (OmniBal A.1.1: the most time saved per byte first): a ViT layer four
    times as slow as an LLM layer (0.4 per byte against 0.25) takes all 60 bytes with its 6
    blocks; the other way round, the 8 LLM blocks first (32) and 2 ViT blocks (20). Bug
    caught: one kind's time used for both, which always gives the second answer."""
    vit, llm = [_Blk() for _ in range(6)], [_Blk() for _ in range(8)]
    r = adaptive_recompute(lambda: None, vit, llm, budget=100.0, safety=1.0,
                           measure=_memory(vit, llm, 40.0, 10.0, 4.0, limit=100.0),
                           time_per_layer=times)  # fmt: skip
    assert (r.vit_plain, r.llm_plain) == want


@pytest.mark.parametrize("budget", [0.0, -1.0])
def test_a_budget_of_no_memory_is_refused(budget):
    with pytest.raises(ValueError, match="budget must be > 0"):
        adaptive_recompute(lambda: None, [], [], budget=budget, measure=lambda step: 0.0)
