"""``equishard train --profile``: the window it records and what it counts.

Planted bugs this catches: a window one step off (the operator counts are those of the steps
run inside it, known here by construction), a window left open at the end of a short run (no
files), a window past the run's last step accepted."""

from __future__ import annotations

import json

import pytest
import torch

from trainer_adapter.train.config import TrainConfig
from trainer_adapter.train.profile import StepProfiler, parse_steps


def _run(tmp_path, steps: int, window: tuple[int, int]) -> StepProfiler:
    prof = StepProfiler(tmp_path, *window, rank=0, device="cpu")
    a = torch.randn(32, 32)
    for step in range(steps):
        prof.before(step)
        for _ in range(step + 1):  # step s runs s + 1 matrix products
            a = torch.mm(a, a).tanh()
        prof.after(step, 0.5)
    prof.close()
    return prof


@pytest.mark.parametrize("window", [(0, 1), (1, 3), (2, 4)])
def test_the_window_holds_exactly_its_steps(tmp_path, window):
    prof = _run(tmp_path, 4, window)
    lo, hi = window
    summary = json.loads((tmp_path / "rank0-summary.json").read_text())
    assert summary == prof.summary
    assert summary["steps"] == hi - lo and summary["wall_s"] == pytest.approx(0.5 * (hi - lo))
    mm = {op["name"]: op["count"] for op in summary["top_host"]}
    assert mm["aten::mm"] == sum(s + 1 for s in range(lo, hi))
    assert "aten::mm" in (tmp_path / "rank0-ops.txt").read_text()


def test_a_window_the_run_does_not_finish_is_written_at_the_end(tmp_path):
    prof = _run(tmp_path, 3, (2, 9))  # the API alone; TrainConfig refuses this window
    assert prof.summary["steps"] == 1
    assert (tmp_path / "rank0-summary.json").exists()


def test_profile_steps_are_checked_where_they_enter():
    assert parse_steps("3:5") == (3, 5)
    for bad in ("3", "5:3", "2:2", "-1:2", "a:b", "1:2:3"):
        with pytest.raises(ValueError, match="profile steps"):
            parse_steps(bad)
    with pytest.raises(ValueError, match="end after the run's 4 steps"):
        TrainConfig(shards="x", dp=1, steps=4, profile="p", profile_steps="3:5")
    TrainConfig(shards="x", dp=1, steps=5, profile="p", profile_steps="3:5")
    TrainConfig(shards="x", dp=1, steps=2)  # the default window matters only with --profile


def test_sync_sites_count_the_lines_that_synchronized():
    """The sync debug mode warns once per synchronizing call; the summary names each line."""
    import warnings

    from trainer_adapter.train.profile import sync_sites

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        warnings.warn("an unrelated warning", stacklevel=1)
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
    sites = sync_sites(caught)
    assert sorted(sites.values()) == [1, 3] and all(":" in k for k in sites)
    assert next(iter(sites.values())) == 3  # most frequent first
