"""The GPU benchmark's pipeline replay against the textbook bubble of GPipe and 1F1B."""

from __future__ import annotations

import pytest

from bench.bench_gpu import replay
from trainer_adapter.train.split_samples import _single_stage_order, chain_actions


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 4), (3, 7)])
def test_equal_passes_give_the_textbook_bubble(name, pp, m):
    """Every forward 1, every backward 2: the step takes (m + pp - 1) x 3 and each stage idles
    (pp - 1) / (m + pp - 1) of it (Narayanan et al., 2021), for GPipe and 1F1B alike."""
    order = chain_actions(_single_stage_order(name, pp, m), (1,) * m)
    fwd = {(s, k): 1.0 for s in range(pp) for k in range(m)}
    bwd = {(s, k): 2.0 for s in range(pp) for k in range(m)}
    span, busy, most = replay(order, fwd, bwd)
    assert span == pytest.approx(3.0 * (m + pp - 1))
    for s in range(pp):
        assert 1 - busy[s] / span == pytest.approx((pp - 1) / (m + pp - 1))
        # GPipe holds every microbatch; 1F1B at most pp - s (its warm-up depth)
        assert most[s] == (m if name == "gpipe" else min(m, pp - s))


def test_a_chain_runs_its_backwards_in_reverse_and_holds_its_rows():
    """Four rows joined by cut samples into one chain: 1F1B over one unit is GPipe over the
    rows, and the last stage holds all four."""
    order = chain_actions(_single_stage_order("1f1b", 2, 1), (4,))
    ones = {(s, k): 1.0 for s in range(2) for k in range(4)}
    span, _, most = replay(order, ones, ones)
    assert most == {0: 4, 1: 4}
    assert span == pytest.approx(4 + 1 + 4 + 1)  # forwards, one hop, backwards, one hop
    backwards = [a.microbatch_index for a in order[1] if a.computation_type.name != "FORWARD"]
    assert backwards == [3, 2, 1, 0]


def test_an_order_that_waits_on_nothing_run_is_refused():
    order = chain_actions(_single_stage_order("1f1b", 2, 2), (1, 1))
    order[0] = order[0][:1]  # stage 0 never runs its other actions
    times = dict.fromkeys([(0, 0), (0, 1), (1, 0), (1, 1)], 1.0)
    with pytest.raises(RuntimeError, match="deadlocks"):
        replay(order, times, times)
