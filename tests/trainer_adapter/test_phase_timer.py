"""The phase timer: each phase's own time and items on a rank, in the contract's record.

Planted bugs these catch: a phase entered twice in a step (forward, then backward) counted
once; the last step's phases left in the next one; a rank with nothing to run in a phase
dropped from the gathered record (the ranks would shift: rank 2's time paired with rank 3's
items); an unknown phase or wait name accepted."""

from __future__ import annotations

import time

import pytest

from equishard.contracts.phase_times import parse_step_times
from trainer_adapter.phase_timer import PhaseTimer, gather_phase_times


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_cpu_clock_counts_work_not_waiting():
    """The default clock on a CPU is the process's CPU time: a rank taken off its core (here: a
    sleep) is not working, and the time does not count; work does."""
    t = PhaseTimer("cpu")
    with t.phase("llm", items=[1]):
        time.sleep(0.05)
    assert t.collect()["phases"]["llm"]["seconds"] < 0.02
    t.reset()
    with t.phase("llm", items=[1]):
        _busy(0.05)
    assert t.collect()["phases"]["llm"]["seconds"] >= 0.05
    with pytest.raises(ValueError, match="clock"):
        PhaseTimer("cpu", clock="gpu")


def test_a_phase_entered_twice_adds_up_and_reset_forgets():
    t = PhaseTimer("cpu", clock="wall")
    with t.phase("vision", items=[256, 64]):
        time.sleep(0.02)
    with t.phase("vision"):  # its backward, later in the step
        time.sleep(0.02)
    t.wait("exchange", 0.5)
    t.wait("exchange", 0.25)
    got = t.collect()
    assert got["phases"]["vision"]["items"] == [256, 64]
    assert got["phases"]["vision"]["seconds"] >= 0.04
    assert got["waits"] == {"exchange": 0.75}
    t.reset()
    assert t.collect() == {"phases": {}, "waits": {}}


def test_measured_elsewhere_is_added_with_its_items():
    t = PhaseTimer("cpu")
    t.add("llm", 1.25, [10, 20])
    assert t.collect()["phases"]["llm"] == {"seconds": 1.25, "items": [10, 20], "padded": False}


def test_unknown_names_are_refused():
    t = PhaseTimer("cpu")
    with pytest.raises(ValueError, match="unknown phase"), t.phase("speech"):
        pass
    with pytest.raises(ValueError, match="unknown wait"):
        t.wait("disk", 1.0)


def test_ranks_without_a_phase_keep_their_place_in_the_record():
    ranks = []
    for r in range(3):
        t = PhaseTimer("cpu")
        if r != 1:  # rank 1 had no images
            t.add("vision", 0.1 * (r + 1), [16] * (r + 1))
        t.add("llm", 1.0 + r, [100 + r])
        t.wait("loader", 0.01 * r)
        ranks.append(t.collect())
    rec = {"step": 0, **gather_phase_times(ranks, {"llm": [1, 2, 3]})}
    st = parse_step_times(rec, "gathered")
    assert st.phases["vision"].seconds == (0.1, 0.0, pytest.approx(0.3))
    assert st.phases["vision"].items == ((16,), (), (16, 16, 16))
    assert st.phases["llm"].items == ((100,), (101,), (102,))
    assert st.phases["llm"].predicted == (1.0, 2.0, 3.0)
    assert st.waits == {"loader": (0.0, 0.01, 0.02)}
