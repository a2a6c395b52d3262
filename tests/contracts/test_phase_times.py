"""The step record of measured phase times: what is read back is checked where it enters.

Planted bugs these catch: a NaN, negative or boolean time let into a fit; an item length past
the limit (or exactly at it refused); ranks that differ between a phase's fields or between
phases (a fit pairing one rank's time with another's items); an unknown phase or field passed
over silently; a generation step taken from ranks that read different steps."""

from __future__ import annotations

import json

import pytest

from equishard.contracts.phase_times import (
    MAX_HARDWARE,
    MAX_ITEM_TOKENS,
    PhaseTimesError,
    parse_step_times,
)


def _record(**over):
    rec = {
        "step": 3,
        "phase_times": {
            "vision": {"seconds": [0.5, 0.25], "items": [[256, 64], [1024]], "predicted": [2, 1]},
            "llm": {"seconds": [1.0, 1.5], "items": [[300, 200], [900]]},
        },
        "waits": {"exchange": [0.1, 0.0], "loader": [0.0, 0.2]},
        "generation": "gen-0001",
        "loader_position": [[0, 7], [0, 7]],
    }
    rec.update(over)
    return json.loads(json.dumps(rec))  # as read from a log


def test_a_record_reads_back_as_written():
    st = parse_step_times(_record(), "log:1")
    assert st.step == 3 and st.ranks == 2 and list(st.phases) == ["vision", "llm"]
    assert st.phases["vision"].items == ((256, 64), (1024,))
    assert st.phases["vision"].predicted == (2.0, 1.0) and st.phases["llm"].predicted is None
    assert st.waits == {"exchange": (0.1, 0.0), "loader": (0.0, 0.2)}
    assert (st.generation, st.generation_step) == ("gen-0001", 7)
    # ranks that read different steps of the generation: no one step to flag
    assert parse_step_times(_record(loader_position=[[0, 7], [0, 8]]), "x").generation_step is None


def _set(path, value):
    rec = _record()
    node = rec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return rec


BAD = {
    "NaN time": (("phase_times", "llm", "seconds"), [float("nan"), 1.0], r"llm.seconds\[0\]"),
    "negative time": (("phase_times", "llm", "seconds"), [1.0, -0.1], r"seconds\[1\]"),
    "boolean time": (("phase_times", "llm", "seconds"), [True, 1.0], "not a time"),
    "string time": (("phase_times", "vision", "seconds"), ["1", 1.0], "not a time"),
    "ranks differ in a phase": (("phase_times", "llm", "items"), [[1]], "1 ranks, but"),
    "ranks differ between phases": (("phase_times", "llm", "seconds"), [1.0], "1 ranks, but"),
    "ranks differ in waits": (("waits", "loader"), [0.1, 0.1, 0.1], "3 ranks, but"),
    "fractional length": (("phase_times", "llm", "items"), [[1.5], [2]], "not a whole number"),
    "negative length": (("phase_times", "llm", "items"), [[-1], [2]], "not a whole number"),
    "length past the limit": (
        ("phase_times", "llm", "items"),
        [[MAX_ITEM_TOKENS + 1], [2]],
        "not a whole number",
    ),
    "unknown phase field": (("phase_times", "llm", "sconds"), [1.0, 1.0], "unknown field"),
    "unknown phase": (("phase_times", "speech"), {"seconds": [1], "items": [[1]]}, "unknown phase"),
    "padded not a flag": (("phase_times", "llm", "padded"), "yes", "not true or false"),
    "predicted NaN": (("phase_times", "vision", "predicted"), [float("nan"), 1], "predicted"),
    "unknown wait": (("waits", "disk"), [0, 0], "'waits'"),
    "step negative": (("step",), -1, "'step'"),
    "step boolean": (("step",), True, "'step'"),
    "no phase times": (("phase_times",), {}, "no 'phase_times'"),
    "hardware too long": (("hardware",), "x" * (MAX_HARDWARE + 1), "'hardware'"),
    "generation not a string": (("generation",), 5, "'generation'"),
    "model not a string": (("model",), ["tiny"], "'model'"),
    "position not pairs": (("loader_position",), [[0, 1, 2]], "'loader_position'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_record_is_refused_naming_where(case):
    path, value, match = BAD[case]
    with pytest.raises(PhaseTimesError, match=match) as exc:
        parse_step_times(_set(path, value), "run.jsonl:9")
    assert str(exc.value).startswith("run.jsonl:9") and "\n" not in str(exc.value)


def test_limits_at_the_edge():
    """An item exactly MAX_ITEM_TOKENS long and hardware exactly MAX_HARDWARE long are read; one
    more is refused (above); zero-length items and zero times are read (a rank idle in it)."""
    ok = _set(("phase_times", "llm", "items"), [[MAX_ITEM_TOKENS], [0]])
    assert parse_step_times(ok, "x").phases["llm"].items == ((MAX_ITEM_TOKENS,), (0,))
    assert parse_step_times(_set(("hardware",), "x" * MAX_HARDWARE), "x").hardware
    assert parse_step_times(_set(("phase_times", "llm", "seconds"), [0.0, 0]), "x")
    with pytest.raises(PhaseTimesError):
        parse_step_times(_set(("hardware",), "x" * (MAX_HARDWARE + 1)), "x")
