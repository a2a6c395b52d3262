"""The per-step report: measured efficiency, prediction error and who the straggler was.

Planted bugs these catch: efficiency as max/mean instead of mean/max, a prediction error that
ignores the unit change between FLOPs and seconds (or takes the mean over ranks, which one rank
drags), a straggler blamed on the data when a slow rank took longer than its share, a loader or
exchange wait that is not blamed first, a persistent straggler counted at exactly half of the
steps."""

from __future__ import annotations

import pytest

from balancing.step_report import assess_step, persistent_stragglers
from equishard.contracts.phase_times import parse_step_times


def _step(vision, llm, pred_v=None, pred_l=None, loader=None, exchange=None, step=0):
    n = len(llm)
    rec = {
        "step": step,
        "phase_times": {
            "vision": {"seconds": vision, "items": [[16]] * n},
            "llm": {"seconds": llm, "items": [[100]] * n},
        },
        "waits": {"loader": loader or [0.0] * n, "exchange": exchange or [0.0] * n},
    }
    if pred_v is not None:
        rec["phase_times"]["vision"]["predicted"] = pred_v
        rec["phase_times"]["llm"]["predicted"] = pred_l
    return parse_step_times(rec, "t")


def test_efficiency_is_mean_over_max_of_each_phase_and_of_the_compute():
    st = _step([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 2.0], [1, 1, 1, 1], [1, 2, 3, 2])
    rep = assess_step(st)
    assert rep["phases"]["llm"]["efficiency"] == pytest.approx(2.0 / 3.0)
    assert rep["phases"]["vision"]["efficiency"] == 1.0
    assert rep["efficiency"] == pytest.approx(3.0 / 4.0)  # compute 2, 3, 4, 3
    assert rep["straggler"] == 2 and rep["straggler_lead_s"] == pytest.approx(1.0)


def test_a_prediction_in_flops_is_scaled_to_seconds_before_its_error():
    """Predicted 1e9 x the measured seconds (FLOPs): a perfect prediction, error 0; one rank off
    by 20 % of four: the median error stays below that rank's own."""
    meas = [1.0, 2.0, 3.0, 4.0]
    rep = assess_step(_step(meas, meas, [x * 1e9 for x in meas], [x * 1e9 for x in meas]))
    assert rep["phases"]["llm"]["prediction_error"] == pytest.approx(0.0, abs=1e-12)
    off = [1.0, 2.0, 3.0, 4.8]
    rep = assess_step(_step(meas, off, meas, meas))
    assert 0 < rep["phases"]["llm"]["prediction_error"] < 0.2


@pytest.mark.parametrize(
    ("case", "want"),
    [
        ("the plan gave it the most", "data"),
        ("it ran slow for what it had", "hardware"),
        ("its next batch came late", "loader"),
        ("the exchange took longer than the lead", "exchange"),
    ],
)
def test_the_straggler_is_attributed(case, want):
    v = [0.1, 0.1, 0.1, 0.1]
    if case == "the plan gave it the most":
        st = _step(v, [1.0, 1.0, 1.0, 1.5], v, [1.0, 1.0, 1.0, 1.5])
    elif case == "it ran slow for what it had":
        st = _step(v, [1.0, 1.0, 1.0, 1.5], v, [1.0, 1.2, 1.0, 1.0])
    elif case == "its next batch came late":
        st = _step(v, [1.0, 1.0, 1.0, 1.5], v, [1, 1, 1, 1.5], loader=[0, 0.6, 0, 0])
    else:
        st = _step(v, [1.0, 1.0, 1.0, 1.2], v, [1, 1, 1, 1.2], exchange=[0.3, 0.4, 0.5, 0.2])
    assert assess_step(st)["attribution"] == want


def test_without_a_prediction_nothing_is_blamed_on_the_data():
    rep = assess_step(_step([0.1, 0.1], [1.0, 2.0]))
    assert rep["attribution"] is None and rep["measured_over_predicted"] is None


def test_a_rank_slower_than_predicted_on_most_steps_is_persistent():
    slow = [1.0, 1.0, 1.3, 1.0]
    even = [1.0, 1.0, 1.0, 1.0]
    pred = [1.0, 1.0, 1.0, 1.0]
    v = [0.1] * 4
    reps = [assess_step(_step(v, slow if i < 3 else even, v, pred)) for i in range(5)]
    assert persistent_stragglers(reps) == {2: 3}
    # exactly half of the steps is not most of them
    reps = [assess_step(_step(v, slow if i < 2 else even, v, pred)) for i in range(4)]
    assert persistent_stragglers(reps) == {}
