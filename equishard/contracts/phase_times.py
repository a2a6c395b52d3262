"""Measured phase times of training steps: the record a training loop writes, and which
``equishard calibrate`` and the step report read back.

One JSON object per step (a line of the loop's ``--log`` file), with at least::

    {"step": 12,
     "phase_times": {
        "vision": {"seconds": [0.41, 0.39, ...],      # per rank, that rank's own work
                   "items": [[1024, 256], [576], ...], # per rank, each item's length
                   "padded": false,                     # items padded to the longest (Whisper)
                   "predicted": [2.1e9, 1.9e9, ...]},  # per rank, the plan's load (its unit)
        "llm": {...}},
     "waits": {"exchange": [...], "loader": [...]},    # per rank, seconds spent waiting
     "hardware": "NVIDIA H100 80GB HBM3 x 8 ranks",    # optional, what it ran on
     "generation": "gen-...", "loader_position": [[epoch, step], ...],  # optional, what it read
     "model": "tiny reference VLM"}                    # optional, what was trained

``seconds`` of a phase is the time of that rank's own compute in it (forward and backward), not
time spent waiting for other ranks in a collective: waits are recorded apart, in ``waits``.
Everything read back is checked here (a log is a user's file): a value of the wrong type, a
NaN or negative time, a rank count that differs between phases, an item length that is no
whole number in ``[0, MAX_ITEM_TOKENS]`` is refused with the step and field it is in.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from equishard.common.errors import EquishardError

__all__ = [
    "MAX_ITEM_TOKENS",
    "MAX_RANKS",
    "PHASE_NAMES",
    "WAITS",
    "PhaseTimes",
    "PhaseTimesError",
    "StepTimes",
    "parse_step_times",
]

PHASE_NAMES = ("vision", "audio", "llm")
WAITS = ("exchange", "loader")
MAX_ITEM_TOKENS = 1 << 24  # one item's length: far above any sequence a model runs
MAX_RANKS = 1 << 17
MAX_ITEMS = 1 << 20  # items of one phase on one rank in one step
MAX_HARDWARE = 512


class PhaseTimesError(EquishardError, ValueError):
    """A step's phase times that cannot be used (the message names the step and field)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseTimes:
    """One phase of one step: per rank, its measured seconds, its items' lengths and the plan's
    predicted load (``None`` where the loop recorded none)."""

    seconds: tuple[float, ...]
    items: tuple[tuple[int, ...], ...]
    padded: bool = False
    predicted: tuple[float, ...] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimes:
    step: int
    phases: dict  # name -> PhaseTimes, in PHASE_NAMES order
    waits: dict  # name -> tuple of per-rank seconds
    hardware: str | None = None  # what the step ran on, in words
    generation: str | None = None  # the shard generation the step read
    generation_step: int | None = None  # which of its steps (every reading rank the same)
    model: str | None = None  # what was trained, in words

    @property
    def ranks(self) -> int:
        return len(next(iter(self.phases.values())).seconds)


def _seconds(value, where: str) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise PhaseTimesError(f"{where}: {value!r} is not a time in seconds (a finite number >= 0)")
    return float(value)


def _per_rank(value, where: str, ranks: int | None, parse) -> tuple:
    if not isinstance(value, list) or not value or len(value) > MAX_RANKS:
        raise PhaseTimesError(f"{where}: expected a list with one entry per rank")
    if ranks is not None and len(value) != ranks:
        raise PhaseTimesError(
            f"{where}: {len(value)} ranks, but the step's other fields have {ranks}"
        )
    return tuple(parse(v, f"{where}[{r}]") for r, v in enumerate(value))


def _items(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise PhaseTimesError(f"{where}: expected a list of item lengths")
    for n in value:
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_ITEM_TOKENS:
            raise PhaseTimesError(
                f"{where}: item length {n!r} is not a whole number in [0, {MAX_ITEM_TOKENS}]"
            )
    return tuple(value)


def _phase(value, where: str, ranks: int | None) -> PhaseTimes:
    if not isinstance(value, dict) or not {"seconds", "items"} <= set(value):
        raise PhaseTimesError(f"{where}: expected an object with 'seconds' and 'items'")
    extra = set(value) - {"seconds", "items", "padded", "predicted"}
    if extra:
        raise PhaseTimesError(f"{where}: unknown field(s) {sorted(extra)}")
    seconds = _per_rank(value["seconds"], f"{where}.seconds", ranks, _seconds)
    items = _per_rank(value["items"], f"{where}.items", len(seconds), _items)
    padded = value.get("padded", False)
    if not isinstance(padded, bool):
        raise PhaseTimesError(f"{where}.padded: {padded!r} is not true or false")
    predicted = value.get("predicted")
    if predicted is not None:
        predicted = _per_rank(predicted, f"{where}.predicted", len(seconds), _seconds)
    return PhaseTimes(seconds=seconds, items=items, padded=padded, predicted=predicted)


def parse_step_times(record, where: str) -> StepTimes:
    """The phase times of one step's log record (a parsed JSON object), checked; ``where``
    names the file and line in every message."""
    if not isinstance(record, dict):
        raise PhaseTimesError(f"{where}: a step record is a JSON object")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise PhaseTimesError(f"{where}: 'step' {step!r} is not a whole number >= 0")
    where = f"{where} (step {step})"
    raw = record.get("phase_times")
    if not isinstance(raw, dict) or not raw:
        raise PhaseTimesError(
            f"{where}: no 'phase_times' (the loop recorded no phase times; run it with them on)"
        )
    unknown = set(raw) - set(PHASE_NAMES)
    if unknown:
        raise PhaseTimesError(f"{where}: unknown phase(s) {sorted(unknown)}; known: {PHASE_NAMES}")
    phases, ranks = {}, None
    for name in PHASE_NAMES:
        if name in raw:
            phases[name] = _phase(raw[name], f"{where} phase_times.{name}", ranks)
            ranks = len(phases[name].seconds)
    waits = record.get("waits", {})
    if not isinstance(waits, dict) or set(waits) - set(WAITS):
        raise PhaseTimesError(f"{where}: 'waits' must be an object with keys among {WAITS}")
    waits = {
        k: _per_rank(waits[k], f"{where} waits.{k}", ranks, _seconds) for k in WAITS if k in waits
    }
    hardware = record.get("hardware")
    if hardware is not None and (not isinstance(hardware, str) or len(hardware) > MAX_HARDWARE):
        raise PhaseTimesError(
            f"{where}: 'hardware' is not a string of at most {MAX_HARDWARE} chars"
        )
    generation, gen_step = record.get("generation"), None
    if generation is not None:
        if not isinstance(generation, str) or len(generation) > MAX_HARDWARE:
            raise PhaseTimesError(f"{where}: 'generation' is not a generation's name")
        gen_step = _generation_step(record.get("loader_position"), where)
    model = record.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_HARDWARE):
        raise PhaseTimesError(f"{where}: 'model' is not a string of at most {MAX_HARDWARE} chars")
    return StepTimes(
        model=model,
        step=step,
        phases=phases,
        waits=waits,
        hardware=hardware,
        generation=generation,
        generation_step=gen_step,
    )


def _generation_step(value, where: str) -> int | None:
    """The generation's step every reading rank read (``loader_position``: [epoch, step] per
    reading rank); None where the ranks read different steps or the field is absent."""
    if value is None:
        return None
    ok = isinstance(value, list) and 0 < len(value) <= MAX_RANKS
    ok = ok and all(
        isinstance(p, list)
        and len(p) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p)
        for p in value
    )
    if not ok:
        raise PhaseTimesError(f"{where}: 'loader_position' is not a list of [epoch, step]")
    steps = {p[1] for p in value}
    return steps.pop() if len(steps) == 1 else None
