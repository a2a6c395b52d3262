"""Phase times in the user's own loop: ``balance_model(..., timer=PhaseTimer())`` times each
balanced module's run on the items the rank received, with their lengths.

Planted bugs these catch: a rank timing the items it sent instead of those it ran (the totals
over ranks would still agree; each rank's would not match its received route), the decoder's
time recorded as the tower's, a rank with nothing to run given items."""

from __future__ import annotations

import pytest

from tests.dist_helper import run_ranks
from tests.trainer_adapter.test_hf_parity import (
    build_model,
    make_batches,
    skip_if_transformers_fails,
)


def _rank(rank, world, family):
    from trainer_adapter.hf.balance import balance_model, global_targets
    from trainer_adapter.phase_timer import PhaseTimer

    model = build_model(family)
    batch = make_batches(family, model)[rank]
    timer = PhaseTimer("cpu")
    balance_model(model, timer=timer)
    out = model(**batch, num_items_in_batch=global_targets(batch["labels"]), use_cache=False)
    out.loss.backward()
    inner = model.model
    tower, decoder = inner.visual, inner.language_model
    got = timer.collect()
    vr, lr = tower.last_route, decoder.last_route
    return {
        "times": got,
        "vision_received": vr.table[vr.received, 0].tolist(),
        "llm_received": lr.table[lr.received, 0].tolist(),
        "tokens": int(batch["input_ids"].numel()),
        "patches": int(grid.prod(dim=1).sum())
        if (grid := batch.get("image_grid_thw")) is not None
        else 0,
    }


@pytest.mark.parametrize("family", ["qwen2vl"])
def test_each_rank_times_what_it_received(family):
    skip_if_transformers_fails(family)
    from equishard.contracts.phase_times import parse_step_times
    from trainer_adapter.phase_timer import gather_phase_times

    res = run_ranks(_rank, 2, family, timeout=300)
    for r in res:
        ph = r["times"]["phases"]
        if r["vision_received"]:
            assert ph["vision"]["items"] == r["vision_received"] and ph["vision"]["seconds"] > 0
        else:
            assert "vision" not in ph
        assert ph["llm"]["items"] == r["llm_received"] and ph["llm"]["seconds"] > 0
    st = parse_step_times({"step": 0, **gather_phase_times([r["times"] for r in res])}, "hf")
    # every token and every patch of the step ran once, on some rank
    assert sum(map(sum, st.phases["llm"].items)) == sum(r["tokens"] for r in res)
    assert sum(map(sum, st.phases["vision"].items)) == sum(r["patches"] for r in res)
