"""Samples cut across pipeline microbatches: the plan, the attention carried across the cut, and
the schedules that run a chain's backwards in reverse.

Anchors: every token of every sample lands exactly once, in order (checked from the spans, not
from the planner's own bookkeeping); a cut sample's output and every gradient equal the whole
sample's plain causal attention in float64; a schedule simulator that knows only the pipeline's
data dependencies (a forward needs the previous stage's forward, a backward the next stage's
backward, a cut piece's backward the later pieces' backwards) runs every expanded order to the
end."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.pipelining.schedules import _ComputationType

from trainer_adapter.train.microbatches import (
    bucket_ladder,
    doc_rows,
    pack_rows,
    plan_microbatches,
    plan_step,
)
from trainer_adapter.train.model import LanguageModel, VLMConfig
from trainer_adapter.train.pipeline import StageModule
from trainer_adapter.train.split_samples import chain_actions, unit_order


def _check_plan(lengths, n_rows, cap, plan):
    assert len(plan.spans) == n_rows and sum(plan.chains) == n_rows
    starts = np.cumsum([0, *plan.chains])
    chain_of = np.repeat(np.arange(len(plan.chains)), plan.chains)
    pieces: dict[int, list] = {}
    for k, row in enumerate(plan.spans):
        assert sum(b - a for _, a, b in row) <= cap
        goes_on = [s for s, a, b in row if b < lengths[s]]
        assert len(goes_on) <= 1  # one piece per row goes on in the next row
        for j, (s, a, b) in enumerate(row):
            assert 0 <= a < b <= lengths[s] or lengths[s] == 0
            if a > 0:
                assert j == 0  # a continuation opens its row
            pieces.setdefault(s, []).append((k, a, b))
    assert sorted(pieces) == list(range(len(lengths)))  # nothing dropped
    for s, ps in pieces.items():
        rows = [k for k, _, _ in ps]
        assert rows == sorted(rows) and len(set(chain_of[rows])) == 1
        assert rows == list(range(rows[0], rows[0] + len(rows)))  # consecutive rows
        assert ps[0][1] == 0 and ps[-1][2] == lengths[s]  # from first token to last
        assert all(p[2] == q[1] for p, q in itertools.pairwise(ps))  # no gap, no overlap
        if len(ps) > 1:
            assert rows[-1] < starts[chain_of[rows[0]] + 1]
    assert plan.padding == pytest.approx(1 - lengths.sum() / (n_rows * cap))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=14),
    st.integers(1, 8),
    st.floats(1.0, 1.6),
)
def test_cut_plans_hold_every_token_once_in_order(lengths, n_rows, slack):
    lengths = np.array(lengths)
    cap = int(np.ceil(lengths.sum() / n_rows * slack))
    plan = plan_microbatches(lengths, n_rows, cap, pp=2, split=True)
    _check_plan(lengths, n_rows, cap, plan)
    if lengths.max() > cap:
        assert plan.n_cut >= 1


def test_whole_samples_are_not_cut_where_they_fit():
    plan = plan_microbatches(np.array([5, 5, 4, 4]), 2, 10, pp=1, split=True)
    assert plan.n_cut == 0 and plan.chains == (1, 1)
    with pytest.raises(ValueError, match="cut across microbatches"):
        plan_microbatches(np.array([30, 2]), 2, 16, pp=1)  # 30 tokens: no row holds it whole


def test_only_samples_that_fit_no_row_whole_are_cut():
    """Where some sample fits no row whole (the plan must cut), the others still go in whole
    where a row has room, an exact fit included: 50 tokens in rows of 25 is cut; the 25 fills
    a row whole (streamed after the 50 instead, it would be cut too), the 15 goes in whole."""
    lengths = [50, 25, 15]
    plan = plan_microbatches(np.array(lengths), 4, 25, pp=1, split=True)
    cut = {s for row in plan.spans for s, a, b in row if a > 0 or b < lengths[s]}
    assert cut == {0} and plan.n_cut == 1


def test_cut_rows_follow_the_mean_load_not_the_longest_sample():
    lens = np.array([3000.0, 200, 150, 120, 90, 60, 40, 30])
    ladder = bucket_ladder(4096, 1.08)
    whole_mb, _ = plan_step(lens, 4, ladder, pp=2)
    cut_mb, plan = plan_step(lens, 4, ladder, pp=2, split=True)
    assert whole_mb >= 3000  # whole: every row fits the longest sample
    smaller = [b for b in ladder if b < cut_mb]
    assert cut_mb >= lens.sum() / 4 and (not smaller or smaller[-1] < lens.sum() / 4)
    assert plan.padding < 0.08 and plan.n_cut >= 1


def _tiny_llm(seed=0):
    torch.manual_seed(seed)
    return LanguageModel(VLMConfig.preset("tiny", vocab_size=50)).double()


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("lengths", [[30, 7, 5, 12, 3], [55, 2]])
def test_cut_sample_attention_and_gradients_equal_the_whole_sample(lengths, recompute):
    """A long sample over three rows (neighbours around it; with [55, 2] its middle piece fills
    a row alone), through a stage, rows backward last to first: output and every parameter's and
    input's gradient equal the plain model over whole samples."""
    llm = _tiny_llm()
    for blk in llm.blocks:
        blk.recompute = recompute
    lengths = np.array(lengths)
    plan = plan_microbatches(lengths, 3, 20, 1, split=True)
    assert max(plan.chains) == 3 and plan.n_cut >= 1
    if len(lengths) == 2:
        assert plan.spans[1] == ((0, 18, 38),)  # a piece that both continues and goes on
    cu = np.concatenate([[0], np.cumsum(lengths)])
    x = torch.randn(int(lengths.sum()), 64, dtype=torch.float64, requires_grad=True)
    w = torch.randn(int(lengths.sum()), 64, dtype=torch.float64)
    ref = llm.forward_blocks(x, lengths.tolist())
    (ref * w).sum().backward()
    want = {n: p.grad.clone() for n, p in llm.named_parameters() if p.grad is not None}
    want_x = x.grad.clone()
    llm.zero_grad()
    x.grad = None

    stage = StageModule(llm, 0, len(llm.blocks), last=False)
    packed = pack_rows(x, cu, plan, 20, 0.0)
    rows = packed.detach().requires_grad_()  # as the trainer hands rows to the schedule
    docs = doc_rows(plan, lengths, 20)
    weights = pack_rows(w, cu, plan, 20, 0.0)
    outs = [stage(rows[k][None], docs[k][None])[0][0] for k in range(3)]
    for k in reversed(range(3)):
        (outs[k] * weights[k]).sum().backward()
    packed.backward(rows.grad)
    got = torch.zeros_like(ref)
    got[torch.from_numpy(_positions(plan, cu, 20))] = torch.cat(
        [outs[k][: sum(b - a for _, a, b in plan.spans[k])] for k in range(3)]
    ).detach()
    assert torch.allclose(got, ref, atol=1e-12)
    for n, p in llm.named_parameters():
        if n in want:
            assert torch.allclose(p.grad, want[n], atol=1e-12), n
    assert torch.allclose(x.grad, want_x, atol=1e-12)


def _positions(plan, cu, mb):
    return np.concatenate(
        [np.arange(cu[s] + a, cu[s] + b) for row in plan.spans for s, a, b in row]
    )


def test_backward_of_an_earlier_piece_first_is_refused():
    llm = _tiny_llm()
    lengths = np.array([30, 7])
    plan = plan_microbatches(lengths, 2, 20, 1, split=True)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    x = torch.randn(int(lengths.sum()), 64, dtype=torch.float64)
    stage = StageModule(llm, 0, len(llm.blocks), last=False)
    rows = pack_rows(x, cu, plan, 20, 0.0)
    docs = doc_rows(plan, lengths, 20)
    outs = [stage(rows[k][None].requires_grad_(), docs[k][None])[0][0] for k in range(2)]
    with pytest.raises(RuntimeError, match="reverse order"):
        outs[0].sum().backward()  # the later piece has not run its backward yet


def _simulate(actions: dict, n_stages: int, chains: tuple[int, ...]) -> None:
    """Run each rank's actions in order, each only when its data is there; fail on a stall."""
    chain_of, start = {}, 0
    for c in chains:
        for m in range(start, start + c):
            chain_of[m] = range(start, start + c)
        start += c
    done, pc = set(), dict.fromkeys(actions, 0)
    while any(pc[r] < len(actions[r]) for r in actions):
        progressed = False
        for r, ops in actions.items():
            if pc[r] == len(ops):
                continue
            a = ops[pc[r]]
            s, m = a.stage_index, a.microbatch_index
            kind = "F" if a.computation_type == _ComputationType.FORWARD else "B"
            if kind == "F":
                ready = s == 0 or ("F", s - 1, m) in done
            else:
                later = [k for k in chain_of[m] if k > m]
                ready = (
                    ("F", s, m) in done
                    and (s == n_stages - 1 or ("B", s + 1, m) in done)
                    and all(("B", s, k) in done for k in later)
                )
            if ready:
                done.add((kind, s, m))
                pc[r] += 1
                progressed = True
        assert progressed, (
            f"stalled at {[(r, actions[r][pc[r]]) for r in actions if pc[r] < len(actions[r])]}"
        )
    n_mb = sum(chains)
    assert done == {(k, s, m) for k in "FB" for s in range(n_stages) for m in range(n_mb)}


def _fake_stages(pp, virtual, rank):
    return [
        SimpleNamespace(
            num_stages=pp * virtual,
            group_size=pp,
            group_rank=rank,
            stage_index=rank + v * pp,
            stage_index_to_group_rank=None,
        )
        for v in range(virtual)
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["gpipe", "1f1b", "interleaved1f1b"]),
    st.integers(2, 4),
    st.lists(st.integers(1, 4), min_size=1, max_size=8),
)
def test_chain_schedules_run_every_chain_backward_in_reverse(name, pp, chains):
    chains = tuple(chains)
    virtual = 2 if name == "interleaved1f1b" else 1
    if name == "interleaved1f1b" and sum(chains) % pp:
        chains = (*chains, pp - sum(chains) % pp)  # the trainer's interleaved needs pp | rows
    actions, units = {}, None
    for rank in range(pp):
        order, units = unit_order(name, chains, _fake_stages(pp, virtual, rank))
        actions[rank] = chain_actions(order, units)[rank]
    assert sum(units) == sum(chains)
    _simulate(actions, pp * virtual, units)


def test_a_stage_reads_its_row_layouts_from_the_host_when_given():
    """With the trainer's host layouts (``row_layouts``) a stage never reads the layout from
    its device input (on a GPU, a sync per microbatch): rows whose device layout is garbage
    give the same output as the true layout, and the layouts are used up in row order."""
    from trainer_adapter.train.pipeline import row_layouts

    llm = _tiny_llm()
    lengths = np.array([30, 7, 5, 12, 3])
    plan = plan_microbatches(lengths, 3, 20, 1, split=True)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    x = torch.randn(int(lengths.sum()), 64, dtype=torch.float64)
    rows, docs = pack_rows(x, cu, plan, 20, 0.0), doc_rows(plan, lengths, 20)
    stage = StageModule(llm, 0, len(llm.blocks), last=False)
    want = [stage(rows[k][None], docs[k][None])[0][0] for k in range(3)]
    stage.carry.reset()
    stage.host_rows = row_layouts(docs)
    garbage = torch.full_like(docs, 7)
    got = [stage(rows[k][None], garbage[k][None])[0][0] for k in range(3)]
    assert not stage.host_rows
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
