"""Per-rank, per-phase time of a step's own work, with the items it ran: what
``equishard calibrate`` fits costs to and the step report compares with the plan.

::

    timer = PhaseTimer(device)
    with timer.phase("vision", items=[h * w for h, w in units_hw.tolist()]):
        emb = tower(patches)
    ...
    timer.wait("exchange", seconds)          # time spent waiting on other ranks
    record = timer.collect()                 # after the step (a GPU step synchronized first)

On a GPU each phase is timed by CUDA events recorded on the current stream: nothing waits for
the device inside the step, and :meth:`collect` reads the events once the step's own
synchronization has passed. On a CPU, the process's CPU time (``time.process_time``, all its
threads) by default: ranks that share cores (more ranks than cores, or other jobs) are taken
off the core for turns that are not their work, and wall time would count those turns
(``clock="wall"`` measures ``time.perf_counter`` instead). A phase entered several times in
a step (its forward, later its backward) adds up; its items are given once.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from equishard.contracts.phase_times import PHASE_NAMES, WAITS

__all__ = ["PhaseTimer", "gather_phase_times"]


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu", *, clock: str = "cpu") -> None:
        if clock not in ("cpu", "wall"):
            raise ValueError(f"clock must be 'cpu' (CPU time) or 'wall', got {clock!r}")
        self.cuda = torch.device(device).type == "cuda"
        self._now = time.process_time if clock == "cpu" else time.perf_counter
        self.reset()

    def reset(self) -> None:
        """Forget the last step's phases (call at the start of a step)."""
        self._spans: dict[str, list] = {}
        self._items: dict[str, list[int]] = {}
        self._padded: dict[str, bool] = {}
        self._waits: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str, items=None, *, padded: bool = False):
        """Time the block as part of phase ``name``; ``items``: the lengths of the items it
        runs (given on the phase's first block of the step)."""
        if name not in PHASE_NAMES:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASE_NAMES)}")
        if items is not None:
            self._items[name] = [int(n) for n in items]
            self._padded[name] = bool(padded)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._spans.setdefault(name, []).append((start, end))
        else:
            t0 = self._now()
            try:
                yield
            finally:
                self._spans.setdefault(name, []).append(self._now() - t0)

    def add(self, name: str, seconds: float, items) -> None:
        """Add ``seconds`` measured elsewhere (a pipeline stage's busy time) to phase ``name``,
        with its items."""
        if name not in PHASE_NAMES:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASE_NAMES)}")
        self._items[name] = [int(n) for n in items]
        self._padded[name] = False
        self._spans.setdefault(name, []).append(float(seconds))

    def wait(self, name: str, seconds: float) -> None:
        """Add ``seconds`` spent waiting (``exchange``: on other ranks in a collective;
        ``loader``: for the next batch)."""
        if name not in WAITS:
            raise ValueError(f"unknown wait {name!r}; waits: {', '.join(WAITS)}")
        self._waits[name] = self._waits.get(name, 0.0) + float(seconds)

    def collect(self) -> dict:
        """This rank's step: ``{"phases": {name: {"seconds", "items", "padded"}}, "waits"}``
        (on a GPU, call after the step synchronized: the events are read here)."""
        phases = {}
        for name in PHASE_NAMES:
            if name not in self._spans and name not in self._items:
                continue
            secs = sum(
                s if isinstance(s, float) else s[0].elapsed_time(s[1]) / 1e3
                for s in self._spans.get(name, [])
            )
            phases[name] = {
                "seconds": float(secs),
                "items": list(self._items.get(name, [])),
                "padded": self._padded.get(name, False),
            }
        return {"phases": phases, "waits": dict(self._waits)}


def gather_phase_times(per_rank: list[dict], predicted: dict | None = None) -> dict:
    """Every rank's :meth:`PhaseTimer.collect` (in rank order) as a step record's
    ``phase_times`` and ``waits`` (:mod:`equishard.contracts.phase_times`); ``predicted``:
    per phase, the plan's per-rank loads. A phase some rank did not time counts 0 s and no items
    there (a rank with nothing to run in it)."""
    names = [n for n in PHASE_NAMES if any(n in r["phases"] for r in per_rank)]
    out: dict = {"phase_times": {}, "waits": {}}
    empty = {"seconds": 0.0, "items": [], "padded": False}
    for name in names:
        rows = [r["phases"].get(name, empty) for r in per_rank]
        entry = {
            "seconds": [row["seconds"] for row in rows],
            "items": [row["items"] for row in rows],
            "padded": any(row["padded"] for row in rows),
        }
        if predicted and name in predicted:
            entry["predicted"] = [float(x) for x in predicted[name]]
        out["phase_times"][name] = entry
    for name in WAITS:
        if any(name in r["waits"] for r in per_rank):
            out["waits"][name] = [r["waits"].get(name, 0.0) for r in per_rank]
    return out
